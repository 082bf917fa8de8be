"""Traces that hold together (issue 40): the real openai client and httpx's own
OpenTelemetry instrumentation against the local model server. The HTTP spans nest under
the live call's span; one trace holds a run across a SIGKILLed child and its resume, with
every parent sent (the killed drive's span, and the killed call's span, sent by the
resume); no replayed call is sent twice; the GenAI attributes are checked by name."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("opentelemetry.instrumentation.httpx")

from opentelemetry.instrumentation.httpx import (
    HTTPX2ClientInstrumentor,
    HTTPXClientInstrumentor,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import crashproof as cp
from crashproof.integrations.otel import instrument

from .jsonl import JsonLines, read

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "models"))
from model_server import ModelServer, Turn  # noqa: E402

KEY = "ab" * 32


def traced_ledger(url: str, spans: Path, **kw: Any) -> cp.Ledger:
    """A ledger instrumented to a JSON-lines file, httpx instrumented to the same."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(spans)))
    # httpx's own instrumentation, for httpx and httpx2 (what the openai SDK sends with
    # from openai 3); instrumented again for this provider (an instrumentor is a singleton)
    for instrumentor in _http_instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
        instrumentor.instrument(tracer_provider=provider)
    ledger = cp.Ledger(url, key=KEY, **kw)
    instrument(ledger, tracer_provider=provider)
    return ledger


def _http_instrumentors() -> list[Any]:
    found: list[Any] = [HTTPXClientInstrumentor()]
    if importlib.util.find_spec("httpx2") is not None:
        found.append(HTTPX2ClientInstrumentor())
    return found


@pytest.fixture(autouse=True)
def _uninstrumented() -> Iterator[None]:
    yield
    for instrumentor in _http_instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()


def flow(ledger: cp.Ledger, server_url: str) -> cp.Workflow[str]:
    """Step ``a``; decision ``chat`` (openai SDK, model ``m``); step ``b``, whose body
    makes its own HTTP request; step ``c``."""
    import httpx
    import openai

    client = openai.OpenAI(api_key="k", base_url=server_url + "/v1", timeout=10)

    def ping() -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": "ping"}]}
        return httpx.post(server_url + "/v1/chat/completions", json=body, timeout=10).status_code

    @ledger.workflow("traced")
    def traced(ctx: cp.Context) -> str:
        ctx.step("a", lambda: 1)
        llm = cp.models.openai_chat(ctx, client)
        reply = llm.create(model="m", messages=[{"role": "user", "content": "hi"}])
        ctx.step("b", ping)
        ctx.step("c", lambda: 3)
        return str(reply.choices[0].message.content)

    return traced


CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import crashproof as cp
from integrations.otel.test_traces import flow, traced_ledger
points = None if {point!r} is None else cp.CrashPoints(match={point!r}, action="sigkill")
ledger = traced_ledger({url!r}, Path({spans!r}), crash_points=points)
print(ledger.run(flow(ledger, {server!r}), run_id="r"))
"""


def _hex(value: str | None) -> int | None:
    return None if value is None else int(value, 16)


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a child interpreter of its own (a SIGKILL kills only it)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_tree(spans: list[dict[str, Any]]) -> str:
    """Assert ``spans`` are one trace, every parent sent, no span id twice; the root's
    name."""
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    ids = [_hex(s["context"]["span_id"]) for s in spans]
    assert len(ids) == len(set(ids)), sorted(s["name"] for s in spans)
    roots = [s for s in spans if s["parent_id"] is None]
    assert [r["name"] for r in roots] == ["run traced"]
    for s in spans:
        assert s["parent_id"] is None or _hex(s["parent_id"]) in ids, s["name"]
    return str(roots[0]["name"])


def parent_of(spans: list[dict[str, Any]], span: dict[str, Any]) -> dict[str, Any]:
    (found,) = [s for s in spans if s["context"]["span_id"] == span["parent_id"]]
    return found


def test_one_trace_holds_a_sigkilled_child_and_its_resume(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    files = [tmp_path / "killed.jsonl", tmp_path / "resumed.jsonl"]
    script = [Turn("hello"), Turn("pong"), Turn("pong")]
    with ModelServer(script) as server:
        for n, spans in enumerate(files):
            point = "before_commit[step_done:b]" if n == 0 else None
            code = CHILD.format(
                tests=str(ROOT / "tests"), url=url, spans=str(spans), server=server.url, point=point
            )
            child = run_child(code)
            if n == 0:  # killed after b's body (its request answered), before b's record
                assert child.returncode == -9, child.stderr
            else:  # the resume: no crash point fires again (b's record lands)
                assert child.returncode == 0, child.stderr
        assert server.count == 3  # the decision was not asked again; b ran twice
    killed, resumed = read(files[0]), read(files[1])
    spans = killed + resumed
    assert one_tree(spans) == "run traced"
    names = [s["name"] for s in spans]
    # Each live call once: a and chat were replayed by the resume; b's span is sent by
    # the resume only (the killed child's b never ended), under the id both share.
    for call in ("step a", "decide chat", "step b", "step c"):
        assert names.count(call) == 1, names
    assert [s["name"] for s in resumed if s["name"].startswith(("step", "decide"))] == [
        "step b",
        "step c",
    ]
    drives = [s for s in spans if s["name"] == "drive traced"]
    assert sorted(d["attributes"]["crashproof.status"] for d in drives) == ["died", "succeeded"]
    assert all(parent_of(spans, d)["name"] == "run traced" for d in drives)
    died = next(d for d in drives if d["attributes"]["crashproof.status"] == "died")
    assert died in resumed  # the killed drive's span, sent by the one that took over
    posts = [s for s in spans if s["name"] == "POST"]
    assert len(posts) == 3  # chat once; b's request in the killed child and again
    b = next(s for s in spans if s["name"] == "step b")
    under_b = [p for p in posts if p["parent_id"] == b["context"]["span_id"]]
    assert len(under_b) == 2  # the killed child's request nests under the span the resume sent
    assert sum(p in killed for p in under_b) == 1
    chat = next(s for s in spans if s["name"] == "decide chat")
    assert [p for p in posts if p["parent_id"] == chat["context"]["span_id"]]
    assert parent_of(spans, chat)["attributes"]["crashproof.status"] == "died"
    attributes = chat["attributes"]
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "m"  # asked for
    assert attributes["gen_ai.response.model"] == "m-2026-01-01"  # answered with
    assert attributes["gen_ai.response.id"].startswith("chatcmpl-")
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0


def test_the_http_span_nests_under_the_live_call_in_an_async_drive(tmp_path: Path) -> None:
    import asyncio

    import openai

    spans = tmp_path / "spans.jsonl"
    with ModelServer([Turn("hello")]) as server:
        ledger = traced_ledger(f"sqlite:///{tmp_path / 'runs.db'}", spans)
        client = openai.AsyncOpenAI(api_key="k", base_url=server.url + "/v1", timeout=10)

        @ledger.workflow("traced")
        async def traced(ctx: cp.AsyncContext) -> str:
            llm = cp.models.openai_chat(ctx, client)
            reply = await llm.create(model="m", messages=[{"role": "user", "content": "hi"}])
            return str(reply.choices[0].message.content)

        assert asyncio.run(ledger.run_async(traced, run_id="x")).startswith("hello")
        assert asyncio.run(ledger.run_async(traced, run_id="x")).startswith("hello")
    found = read(spans)
    assert one_tree(found) == "run traced"
    (post,) = [s for s in found if s["name"] == "POST"]
    assert parent_of(found, post)["name"] == "decide chat"
    assert [s["name"] for s in found].count("decide chat") == 1  # the second run replays


class Poster(cp.Tool):
    """An effect over HTTP (a POST to the model server), with a lookup of its own record
    (a file beside the ledger): the lookup needs no request."""

    name = "poster"
    version = "1"

    def __init__(self, url: str, done: Path) -> None:
        self.url, self.done = url, done

    def execute(self, call: cp.Call) -> cp.Receipt:
        import httpx

        body = {"model": "m", "messages": [{"role": "user", "content": "post"}]}
        httpx.post(self.url + "/v1/chat/completions", json=body, timeout=10)
        self.done.write_text(call.operation_id)
        return cp.Receipt(call.operation_id, {"sent": True}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if self.done.exists() and self.done.read_text() == call.operation_id:
            return cp.Receipt(call.operation_id, {"sent": True}, call.intent_digest)
        return None


def act_flow(ledger: cp.Ledger, server_url: str, done: Path) -> cp.Workflow[str]:
    poster = Poster(server_url, done)

    @ledger.workflow("traced")
    def traced(ctx: cp.Context) -> str:
        ctx.step("a", lambda: 1)
        ctx.act("post", poster)
        return "ok"

    return traced


ACT_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import crashproof as cp
from integrations.otel.test_traces import act_flow, traced_ledger
points = None if {point!r} is None else cp.CrashPoints(match={point!r}, action="sigkill")
ledger = traced_ledger({url!r}, Path({spans!r}), crash_points=points)
print(ledger.run(act_flow(ledger, {server!r}, Path({done!r})), run_id="r"))
"""


def test_a_tools_http_span_nests_under_its_act_across_a_sigkill(tmp_path: Path) -> None:
    """The tool's own request runs under the act's span; killed after the effect and
    before its receipt, the resume looks it up (a lookup span) and sends the act's span
    under the id the killed execute's request names as its parent."""
    url, done = f"sqlite:///{tmp_path / 'runs.db'}", tmp_path / "done"
    files = [tmp_path / "killed.jsonl", tmp_path / "resumed.jsonl"]
    with ModelServer([Turn("ok"), Turn("ok")]) as server:
        for n, spans in enumerate(files):
            point = "before_commit[step_done:post]" if n == 0 else None
            code = ACT_CHILD.format(
                tests=str(ROOT / "tests"),
                url=url,
                spans=str(spans),
                server=server.url,
                point=point,
                done=str(done),
            )
            child = run_child(code)
            assert child.returncode == (-9 if n == 0 else 0), child.stderr
        assert server.count == 1  # the effect once: the resume looked it up
    killed, resumed = read(files[0]), read(files[1])
    spans = killed + resumed
    assert one_tree(spans) == "run traced"
    (post,) = [s for s in spans if s["name"] == "POST"]
    assert post in killed
    act = parent_of(spans, post)  # sent by the resume, under the killed execute's id
    assert act["name"] == "act post"
    assert act in resumed
    assert act["attributes"]["crashproof.reconciled"] is True
    (lookup,) = [s for s in resumed if s["name"] == "lookup post"]
    assert parent_of(spans, lookup)["name"] == "drive traced"
    assert [s["name"] for s in spans].count("act post") == 1
