"""OpenTelemetry from committed records (crashproof.integrations.otel): a crashed and
resumed run exports each live call's span exactly once, a replay exports nothing, and the
attributes (GenAI ones on a model SDK's decision) are the documented ones. The SDK's own
in-memory exporter and metric reader count what leaves."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import crashproof as cp
from crashproof.integrations.otel import instrument

ROOT = Path(__file__).resolve().parents[3]
KEY = "ab" * 32


class Seen:
    """An exporter and a metric reader, and the ledgers instrumented to them."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer = TracerProvider()
        self.tracer.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter = MeterProvider(metric_readers=[self.reader])

    def ledger(self, url: str, **kw: Any) -> cp.Ledger:
        ledger = cp.Ledger(url, key=KEY, **kw)
        instrument(ledger, tracer_provider=self.tracer, meter_provider=self.meter)
        return ledger

    def names(self) -> list[str]:
        return [s.name for s in self.spans.get_finished_spans()]

    def calls(self) -> list[str]:
        return [n for n in self.names() if not n.startswith(("drive ", "run "))]

    def counts(self, metric: str) -> dict[tuple[tuple[str, Any], ...], int]:
        data = self.reader.get_metrics_data()
        out: dict[tuple[tuple[str, Any], ...], int] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        for point in m.data.data_points:
                            out[tuple(sorted(point.attributes.items()))] = int(point.value)
        return out


def one_tree(spans: Any) -> str:
    """Assert ``spans`` are one trace whose every parent was sent, and no span id twice;
    returns the root's name."""
    assert len({s.context.trace_id for s in spans}) == 1
    ids = [s.context.span_id for s in spans]
    assert len(ids) == len(set(ids))
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1
    for s in spans:
        assert s.parent is None or s.parent.span_id in ids, (s.name, dict(s.attributes))
    return str(roots[0].name)


class Counter(cp.Tool):
    """Appends each execution's operation id to a file; looks up by it."""

    name = "counter"
    supports_lookup = True

    def __init__(self, path: Path) -> None:
        self.path = path

    def execute(self, call: cp.Call) -> cp.Receipt:
        with self.path.open("a") as f:
            f.write(call.operation_id + "\n")
        return cp.Receipt(call.operation_id, "done", call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        done = self.path.read_text().split() if self.path.exists() else []
        return (
            cp.Receipt(call.operation_id, "done", call.intent_digest)
            if call.operation_id in done
            else None
        )


def flow(tool: Counter) -> cp.Workflow[list[str]]:
    @cp.workflow("traced", version="1")
    def traced(ctx: cp.Context) -> list[str]:
        out = [ctx.step(f"s{k}", lambda k=k: f"v{k}") for k in range(3)]
        plan = ctx.decide(
            "plan",
            lambda: cp.Decision("go", model="m-1", usage={"input_tokens": 3, "output_tokens": 2}),
        )
        out.append(ctx.act("send", tool, text=plan))
        out.append(ctx.step("s3", lambda: "v3"))
        return out

    return traced


def test_a_crashed_and_resumed_run_exports_each_span_once(tmp_path: Path) -> None:
    seen = Seen()
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    tool = Counter(tmp_path / "effects")
    crashing = seen.ledger(url, crash_points=cp.CrashPoints(match="before_commit[step_done:s3]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow(tool), run_id="r")
    first = seen.calls()
    assert first == ["step s0", "step s1", "step s2", "decide plan", "act send"]
    resumed = seen.ledger(url)
    assert resumed.run(flow(tool), run_id="r") == ["v0", "v1", "v2", "done", "v3"]
    assert seen.calls() == [*first, "step s3"]  # the union: each live call once
    drives = [s for s in seen.spans.get_finished_spans() if s.name == "drive traced"]
    # the crashed drive's span, sent by the resume (its steps name it), and the resume's
    assert [d.attributes["crashproof.status"] for d in drives] == ["died", "succeeded"]
    assert one_tree(seen.spans.get_finished_spans()) == "run traced"
    again = seen.ledger(url)
    assert again.run(flow(tool), run_id="r") == ["v0", "v1", "v2", "done", "v3"]
    assert seen.calls() == [*first, "step s3"]  # an ended run answers from its record
    assert seen.counts("crashproof.runs") == {(("status", "succeeded"),): 1}
    assert seen.counts("crashproof.acts") == {(("outcome", "confirmed"),): 1}


def test_the_attributes_are_the_documented_ones(tmp_path: Path) -> None:
    seen = Seen()
    ledger = seen.ledger(f"sqlite:///{tmp_path / 'runs.db'}")
    ledger.run(flow(Counter(tmp_path / "effects")), run_id="r")
    spans = {s.name: s for s in seen.spans.get_finished_spans()}
    drive = spans["drive traced"]
    assert drive.attributes["crashproof.status"] == "succeeded"
    act = spans["act send"]
    assert act.parent is not None
    assert act.parent.span_id == drive.context.span_id
    assert act.attributes["crashproof.operation_id"] == "r/send"
    assert act.attributes["crashproof.step_key"] == "send"
    assert act.attributes["crashproof.kind"] == "act"
    assert act.attributes["crashproof.receipt_id"] == "r/send"
    assert isinstance(act.attributes["crashproof.fencing_token"], int)
    decide = spans["decide plan"]
    assert decide.attributes["gen_ai.operation.name"] == "chat"
    assert decide.attributes["gen_ai.response.model"] == "m-1"  # what the Decision says
    assert decide.attributes["gen_ai.usage.input_tokens"] == 3
    assert decide.attributes["gen_ai.usage.output_tokens"] == 2
    assert drive.start_time <= act.start_time <= act.end_time <= drive.end_time


CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import crashproof as cp
from integrations.otel.test_telemetry import Counter, flow, KEY
ledger = cp.Ledger({url!r}, key=KEY, crash_points=cp.CrashPoints(match={point!r}, action="sigkill"))
ledger.run(flow(Counter(Path({effects!r}))), run_id="r")
"""


@pytest.mark.parametrize(
    ("point", "live_after"),
    [
        ("before_commit[step_done:s2]", ["step s2", "decide plan", "act send", "step s3"]),
        ("before_commit[step_done:send]", ["lookup send", "act send", "step s3"]),  # no receipt
    ],
)
def test_a_sigkilled_child_resumed_here_exports_only_what_runs_live_here(
    tmp_path: Path, point: str, live_after: list[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    effects = tmp_path / "effects"
    code = CHILD.format(tests=str(ROOT / "tests"), url=url, point=point, effects=str(effects))
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
    )
    assert child.returncode == -9, child.stderr
    seen = Seen()
    ledger = seen.ledger(url)
    assert ledger.run(flow(Counter(effects)), run_id="r") == ["v0", "v1", "v2", "done", "v3"]
    assert seen.calls() == live_after
    assert effects.read_text().split() == ["r/send"]  # once, before or after the kill
    looked_up = point.endswith("send]")
    assert seen.counts("crashproof.acts") == {
        (("outcome", "looked_up" if looked_up else "confirmed"),): 1
    }


def test_an_async_drive_is_traced_through_the_batched_commits(tmp_path: Path) -> None:
    seen = Seen()
    ledger = seen.ledger(f"sqlite:///{tmp_path / 'runs.db'}")

    @ledger.workflow("async-traced")
    async def traced(ctx: cp.AsyncContext, n: int) -> int:
        for k in range(3):
            await ctx.step(f"s{k}", lambda k=k: k)
        return n

    async def many() -> list[int]:
        return await asyncio.gather(
            *(ledger.run_async(traced, run_id=f"a{n}", n=n) for n in range(4))
        )

    assert asyncio.run(many()) == [0, 1, 2, 3]
    assert sorted(seen.calls()) == sorted(["step s0", "step s1", "step s2"] * 4)
    runs = {s.attributes["crashproof.run_id"] for s in seen.spans.get_finished_spans()}
    assert runs == {"a0", "a1", "a2", "a3"}
    assert seen.counts("crashproof.runs") == {(("status", "succeeded"),): 4}


def test_a_decision_through_the_openai_sdk_carries_the_gen_ai_attributes(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from apis import Api
    from model_server import ModelServer, Turn

    api = Api("chat")
    seen = Seen()
    with ModelServer([Turn("hello")]) as server:
        ledger = seen.ledger(f"sqlite:///{tmp_path / 'runs.db'}")
        client = api.client(server.url, is_async=False, timeout=5)

        @ledger.workflow("chat")
        def chat(ctx: cp.Context) -> str:
            llm = cp.models.openai_chat(ctx, client)
            return api.text(llm.create(**api.request([{"role": "user", "content": "hi"}])))

        assert ledger.run(chat, run_id="c").startswith("hello")
    (decide,) = [s for s in seen.spans.get_finished_spans() if s.name.startswith("decide ")]
    assert decide.attributes["gen_ai.request.model"]
    assert decide.attributes["gen_ai.usage.input_tokens"] > 0
    assert decide.attributes["gen_ai.usage.output_tokens"] > 0


def test_import_crashproof_needs_no_opentelemetry() -> None:
    code = "import sys, crashproof; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "False"
