"""The OpenAI Agents SDK's ``Runner`` on a ``durable_agent``, through the real SDK and
``openai`` client against the local model server speaking the Responses API: model
calls are decisions (a replay asks nothing: the answer's nonce stays), function tools
steps or acts, each effect once across a crash."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import crashproof as cp
from crashproof.integrations.openai_agents import durable, durable_agent

sys.path.insert(0, str(Path(__file__).parents[1] / "pydantic_ai"))
sys.path.insert(0, str(Path(__file__).parents[2] / "models"))
from model_server import ModelServer, Turn
from pyd_agents import Forge, lines

pytestmark = pytest.mark.timeout(60)
set_tracing_disabled(True)

SCRIPT = [
    Turn(
        "look", (("add", '{"x": 5}'), ("note", '{"text": "hi"}'), ("open_pr", '{"title": "fix"}'))
    ),
    Turn("done"),
]


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(SCRIPT) as s:
        yield s


def make(directory: Path, url: str, note_on_unknown: str = "review") -> Agent[Any]:
    """``note``: an effect whose unknown outcome means ``note_on_unknown``; its target
    dedupes by text (every send in ``effects``, each text once in ``delivered``)."""
    effects = directory / "effects"

    @function_tool
    def add(x: int) -> int:
        """Add one."""
        with effects.open("a") as f:
            f.write(f"{x}\n")
        return x + 1

    @function_tool
    def note(text: str) -> str:
        """Write a note."""
        with effects.open("a") as f:
            f.write(f"{text}\n")
        if text not in lines(directory / "delivered"):
            with (directory / "delivered").open("a") as f:
                f.write(f"{text}\n")
        return "noted"

    @function_tool
    def open_pr(title: str) -> str:
        """Open a PR (the forge performs it)."""
        raise AssertionError("the forge performs open_pr")

    client = AsyncOpenAI(api_key="k", base_url=url + "/v1", max_retries=0)
    agent = Agent(
        name="helper",
        instructions="help",
        model=OpenAIResponsesModel(model="m", openai_client=client),
        tools=[add, note, open_pr],
    )
    return durable_agent(
        agent,
        tools={"open_pr": Forge(directory / "prs.json")},
        effects={"note": cp.OnUnknown(note_on_unknown)},
    )


def workflow(ledger: cp.Ledger, agent: Agent[Any], mode: str) -> cp.Workflow[Any]:
    async def run_async(ctx: cp.AsyncContext, prompt: str) -> Any:
        with durable(ctx):
            return (await Runner.run(agent, prompt)).final_output

    def run_sync(ctx: cp.Context, prompt: str) -> Any:
        with durable(ctx):
            return Runner.run_sync(agent, prompt).final_output

    return ledger.workflow("helper", version="1")(run_async if mode == "async" else run_sync)


def drive(ledger: cp.Ledger, wf: cp.Workflow[Any], mode: str) -> Any:
    if mode == "async":
        return asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))
    return ledger.run(wf, run_id="r", prompt="go")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_runner_run_is_journaled_and_replayed(
    server: ModelServer, mode: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        out = drive(ledger, workflow(ledger, make(tmp_path, server.url), mode), mode)
        info = ledger.get_run("r")
    assert out.startswith("done [")
    assert [(s.key, s.kind.value) for s in info.steps] == [
        ("helper:model", "decide"),
        ("helper:model/0:add", "step"),
        ("helper:model/1:note", "act"),
        ("helper:model/2:open_pr", "act"),
        ("helper:model#2", "decide"),
    ]
    assert info.budget.tokens > 0
    with cp.Ledger(url) as ledger:  # replayed by another ledger: nothing asked
        assert drive(ledger, workflow(ledger, make(tmp_path, server.url), mode), mode) == out
    assert server.count == 2
    assert lines(tmp_path / "effects") == ["5", "hi"]
    assert list(json.loads((tmp_path / "prs.json").read_text())) == ["r/helper:model/2:open_pr"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_crash_after_the_tools_repeats_no_call_and_no_effect(
    server: ModelServer, mode: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match="after_commit[step_done:helper:model/2:open_pr]")
    with cp.Ledger(url, crash_points=crash) as ledger, pytest.raises(cp.SimulatedCrash):
        drive(ledger, workflow(ledger, make(tmp_path, server.url), mode), mode)
    assert server.count == 1
    with cp.Ledger(url) as ledger:
        out = drive(ledger, workflow(ledger, make(tmp_path, server.url), mode), mode)
    assert out.startswith("done [")
    assert server.count == 2  # the first call not asked again
    assert lines(tmp_path / "effects") == ["5", "hi"]
    assert len(json.loads((tmp_path / "prs.json").read_text())) == 1


def test_a_streamed_run_is_recorded_and_replayed(server: ModelServer, tmp_path: Path) -> None:
    """``Runner.run_streamed``: each model call is the same decision as under
    ``Runner.run``, its stream drained inside it; the consumer gets the recorded
    response as events. The first drive stops (a simulated crash) after the first
    model call's ``response.completed``; the resumed drive asks only the second call
    and emits the first call's events again, the same ones."""
    seen: list[list[Any]] = []

    async def stream(ctx: cp.AsyncContext) -> Any:
        events: list[Any] = []
        seen.append(events)
        agent = make(tmp_path, server.url)  # a client per drive: each runs its own loop
        with durable(ctx):
            result = Runner.run_streamed(agent, "go")
            async for event in result.stream_events():
                if event.type != "raw_response_event":
                    continue
                events.append([event.data.type, getattr(event.data, "delta", None)])
                if len(seen) == 1 and event.data.type == "response.completed":
                    raise cp.SimulatedCrash("after the first model call's events")
            return result.final_output

    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        wf = ledger.workflow("stream", version="1")(stream)
        with pytest.raises(cp.SimulatedCrash):  # its loop closes: the SDK's task ends too
            asyncio.run(ledger.run_async(wf, run_id="r"))
        assert server.count == 1
        output = asyncio.run(ledger.run_async(wf, run_id="r"))
    assert server.count == 2  # the recorded first call was not asked again
    first, resumed = seen
    assert resumed[: len(first)] == first  # the recorded call's events, emitted again
    assert first[0] == ["response.output_text.delta", first[0][1]]
    assert first[0][1].startswith("look")
    assert [kind for kind, _ in first[1:]] == ["response.output_item.done"] * 4 + [
        "response.completed"
    ]
    assert resumed[-1][0] == "response.completed"
    assert output.startswith("done")
    assert resumed[-3][1] == output
    assert lines(tmp_path / "effects") == ["5", "hi"]


def test_an_agent_without_a_name_is_refused() -> None:
    with pytest.raises(cp.CrashproofError, match="named agent"):
        durable_agent(Agent(name=""))


@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("inside[act:helper:model/2:open_pr:opened]", "SAME"),  # looked up, not re-sent
        ("before_commit[step_done:helper:model/1:note]", "REFUSED"),  # no lookup: review
    ],
)
def test_a_lost_receipt_is_looked_up_or_frozen_never_repeated(
    server: ModelServer, point: str, outcome: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match=point)
    with cp.Ledger(url, crash_points=crash) as ledger, pytest.raises(cp.SimulatedCrash):
        drive(ledger, workflow(ledger, make(tmp_path, server.url), "async"), "async")
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make(tmp_path, server.url), "async")
        if outcome == "SAME":
            assert drive(ledger, wf, "async").startswith("done [")
        else:
            with pytest.raises(cp.RunFrozen) as frozen:
                drive(ledger, wf, "async")
            assert frozen.value.status == "needs_review"
    assert lines(tmp_path / "effects") == ["5", "hi"]
    prs = tmp_path / "prs.json"
    assert (len(json.loads(prs.read_text())) if prs.exists() else 0) == (outcome == "SAME")


def test_a_handoff_replays_to_the_same_agent(tmp_path: Path) -> None:
    script = [Turn("handing off", (("transfer_to_expert", "{}"),)), Turn("expert answer")]
    with ModelServer(script) as server:
        client = AsyncOpenAI(api_key="k", base_url=server.url + "/v1", max_retries=0)
        model = OpenAIResponsesModel(model="m", openai_client=client)
        expert = Agent(name="expert", instructions="answer", model=model)
        triage = durable_agent(Agent(name="triage", model=model, handoffs=[expert]))
        url = f"sqlite:///{tmp_path}/runs.db"
        outs = []
        for _ in range(2):
            with cp.Ledger(url) as ledger:
                outs.append(drive(ledger, workflow(ledger, triage, "async"), "async"))
                keys = [s.key for s in ledger.get_run("r").steps]
        assert server.count == 2
    assert outs[0] == outs[1]
    assert outs[0].startswith("expert answer [")
    assert keys == ["triage:model", "expert:model"]
