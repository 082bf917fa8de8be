"""pydantic-ai agents under ``CrashproofDurability``, with pydantic-ai's own test kit
(``FunctionModel``, ``TestModel``): what is journaled, under which names, and what a
crash costs (one model request at most; no tool effect twice)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import UserError
from pydantic_ai.models.test import TestModel
from pydantic_ai.run import AgentRunResultEvent

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable, effect

from .pyd_agents import drive as _drive
from .pyd_agents import lines, make_agent, workflow

pytestmark = pytest.mark.timeout(60)

MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_the_steps_are_named_by_request_and_tool_call(mode: str, tmp_path: Path) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        wf = workflow(ledger, make_agent(tmp_path), mode)
        assert _drive(ledger, wf, mode, prompt="go") == "done"
        info = ledger.get_run("r")
    assert [(s.key, s.kind.value) for s in info.steps] == [
        ("adder:model_request", "decide"),
        ("adder:model_request/0:add", "step"),
        ("adder:model_request/1:note", "act"),
        ("adder:model_request/2:open_pr", "act"),
        ("adder:model_request#2", "decide"),
    ]
    assert info.steps[2].operation_id == "r/adder:model_request/1:note"
    assert info.steps[0].model == "function:model:"
    assert info.steps[0].usage is not None
    assert info.steps[0].usage["total_tokens"] > 0
    assert info.budget.decisions == 2
    assert lines(tmp_path / "effects") == ["5", "hi"]
    assert list(json.loads((tmp_path / "prs.json").read_text())) == [
        "r/adder:model_request/2:open_pr"
    ]


@pytest.mark.parametrize("mode", MODES)
def test_a_crash_in_the_second_request_repeats_neither_the_first_nor_a_tool(
    mode: str, tmp_path: Path
) -> None:
    """Crashed in one kind of workflow, resumed in the other: the journals are one."""
    other = "async" if mode == "sync" else "sync"
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, crash_on_request=2), mode)
        with pytest.raises(cp.SimulatedCrash):
            _drive(ledger, wf, mode, prompt="go")
    assert lines(tmp_path / "asked") == ["1", "3"]
    with cp.Ledger(url) as ledger:  # a restarted process
        wf = workflow(ledger, make_agent(tmp_path), other)
        assert _drive(ledger, wf, other, prompt="go") == "done"
        # and a completed run replays without asking anything
        assert _drive(ledger, wf, other, prompt="go") == "done"
    assert lines(tmp_path / "asked") == ["1", "3", "3"]  # only the lost request again
    assert lines(tmp_path / "effects") == ["5", "hi"]  # DBOS gives ['5', '5'] here
    assert len(json.loads((tmp_path / "prs.json").read_text())) == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_lost_receipt_is_looked_up_not_executed_again(mode: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match="inside[act:adder:model_request/2:open_pr:opened]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        wf = workflow(ledger, make_agent(tmp_path), mode)
        with pytest.raises(cp.SimulatedCrash):
            _drive(ledger, wf, mode, prompt="go")
    assert crash.fired is not None
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path), mode)
        assert _drive(ledger, wf, mode, prompt="go") == "done"
    assert len(json.loads((tmp_path / "prs.json").read_text())) == 1
    assert lines(tmp_path / "asked") == ["1", "3"]


def test_an_effect_whose_receipt_was_lost_freezes_instead_of_running_again(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match="before_commit[step_done:adder:model_request/1:note]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        with pytest.raises(cp.SimulatedCrash):
            _drive(ledger, wf, "sync", prompt="go")
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        with pytest.raises(cp.RunFrozen) as frozen:
            _drive(ledger, wf, "sync", prompt="go")
    assert frozen.value.status == "needs_review"
    assert lines(tmp_path / "effects") == ["5", "hi"]  # never a blind second note


@pytest.mark.parametrize("mode", MODES)
def test_a_function_tool_as_an_effect_never_runs_twice(mode: str, tmp_path: Path) -> None:
    """``functions="effect"``: a crash between a plain tool's effect and its record
    leaves [5], not ['5', '5']: the run waits for review instead of guessing."""
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match="before_commit[step_done:adder:model_request/0:add]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, functions="effect"), mode)
        with pytest.raises(cp.SimulatedCrash):
            _drive(ledger, wf, mode, prompt="go")
        assert ledger.get_run("r").steps[1].kind is cp.StepKind.ACT
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, functions="effect"), mode)
        with pytest.raises(cp.RunFrozen) as frozen:
            _drive(ledger, wf, mode, prompt="go")
    assert frozen.value.status == "needs_review"
    assert lines(tmp_path / "effects") == ["5"]


def test_the_budget_counts_model_tokens(tmp_path: Path) -> None:
    options = cp.RunOptions(limits=cp.Limits(max_tokens=10))
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        with pytest.raises(cp.RunStopped) as stopped:
            ledger.run(wf, run_id="r", prompt="go", options=options)
    assert stopped.value.reason == "budget:tokens"
    assert lines(tmp_path / "asked") == ["1"]


def test_test_model_runs_every_tool_once_and_replays(tmp_path: Path) -> None:
    seen: list[int] = []
    agent = Agent(TestModel(), name="tm", capabilities=[CrashproofDurability()])

    @agent.tool_plain
    def square(n: int) -> int:
        seen.append(n)
        return n * n

    url = f"sqlite:///{tmp_path}/runs.db"
    for _ in range(2):
        with cp.Ledger(url) as ledger:

            @ledger.workflow("tm", version="1")
            def run(ctx: cp.Context) -> str:
                with durable(ctx):
                    return agent.run_sync("square something").output

            out = ledger.run(run, run_id="r")
    assert json.loads(out) == {"square": 0}
    assert seen == [0]


@pytest.mark.parametrize("mode", MODES)
def test_the_tool_calls_of_one_response_run_one_at_a_time_in_its_order(
    mode: str, tmp_path: Path
) -> None:
    # pydantic-ai runs a response's tool calls at once; the journal's order must be the
    # model's on every drive, so under the capability they never overlap.
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[ToolCallPart("slow", {"n": n}, tool_call_id=f"c{n}") for n in (3, 1, 2)]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="waiter", capabilities=[CrashproofDurability()])
    seen: list[str] = []

    @agent.tool_plain
    async def slow(n: int) -> int:
        seen.append(f"start {n}")
        await asyncio.sleep(0.01 * n)
        seen.append(f"end {n}")
        return n

    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        assert _drive(ledger, workflow(ledger, agent, mode), mode, prompt="go") == "done"
        keys = [s.key for s in ledger.get_run("r").steps]
    assert seen == ["start 3", "end 3", "start 1", "end 1", "start 2", "end 2"]
    assert keys[1:4] == [f"waiter:model_request/{i}:slow" for i in range(3)]


# -- bad input: a clear error, and nothing sent ---------------------------------------


def test_an_agent_without_a_name_is_refused() -> None:
    with pytest.raises(UserError, match="needs a named agent"):
        Agent(TestModel(), capabilities=[CrashproofDurability()])


def test_a_run_outside_a_workflow_is_refused(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    with pytest.raises(UserError, match="outside a crashproof workflow"):
        agent.run_sync("go")
    assert lines(tmp_path / "asked") == []


def _streaming_agent(directory: Path, model_url: str) -> Agent[None, str]:
    """A named agent on a real ``OpenAIChatModel`` (the local model server) with a
    ``note`` effect; streamed requests go out as SSE streams."""
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=model_url + "/v1", api_key="k")
    agent = Agent(
        OpenAIChatModel("gpt-test", provider=provider),
        name="notes",
        capabilities=[CrashproofDurability()],
    )

    @agent.tool_plain(metadata=effect())
    def note(text: str) -> str:
        """Write a note."""
        with (directory / "effects").open("a") as f:
            f.write(text + "\n")
        return "noted"

    return agent


@pytest.mark.parametrize("api", ["run_stream_events", "run_stream"])
def test_a_streamed_run_is_recorded_and_replayed(tmp_path: Path, api: str) -> None:
    """A streamed request is one decision, its stream drained inside it and committed
    before the consumer sees its events. The first drive stops (a simulated crash)
    while the stream is consumed: ``run_stream_events`` at the end of the first
    request's first part, ``run_stream`` once the answer's text was shown. The resumed
    drive asks only what no record holds, and the consumer gets the recorded
    request's events again, the same ones."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "models"))
    from model_server import ModelServer, Turn

    tool_turn = Turn(calls=(("note", '{"text": "hi"}'),))
    script = [tool_turn, Turn("done")] if api == "run_stream_events" else [Turn("done")]
    seen: list[list[str]] = []

    async def events(agent: Agent[None, str], kinds: list[str]) -> str:
        async with agent.run_stream_events("note it") as stream:
            async for event in stream:
                kinds.append(type(event).__name__)
                if len(seen) == 1 and kinds[-1] == "PartEndEvent":
                    raise cp.SimulatedCrash("while the stream is consumed")
                if isinstance(event, AgentRunResultEvent):
                    return str(event.result.output)
        raise AssertionError("the stream ended without a result")

    async def text(agent: Agent[None, str], kinds: list[str]) -> str:
        async with agent.run_stream("note it") as result:
            kinds.extend([t async for t in result.stream_text(delta=True)])
            output = await result.get_output()
        if len(seen) == 1:
            raise cp.SimulatedCrash("after the answer was shown")
        return output

    async def workflow(ctx: cp.AsyncContext) -> str:
        agent = _streaming_agent(tmp_path, server.url)  # a client per drive (its own loop)
        kinds: list[str] = []
        seen.append(kinds)
        with durable(ctx):
            return await (events if api == "run_stream_events" else text)(agent, kinds)

    with ModelServer(script=script, by_turn=True) as server:
        with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
            wf = ledger.workflow("stream", version="1")(workflow)
            with pytest.raises(cp.SimulatedCrash):
                asyncio.run(ledger.run_async(wf, run_id="r"))
            assert server.count == 1
            output = asyncio.run(ledger.run_async(wf, run_id="r"))
        assert server.count == len(script)  # the recorded request was not asked again
    assert output.startswith("done")
    first, resumed = seen
    assert resumed[: len(first)] == first  # the recorded request's events, again
    if api == "run_stream_events":
        assert first == ["PartStartEvent", "FinalResultEvent", "PartEndEvent"]
        assert resumed[-1] == "AgentRunResultEvent"
        assert lines(tmp_path / "effects") == ["hi"]
    else:
        assert "".join(first) == output


def test_run_stream_sync_in_a_sync_workflow(tmp_path: Path) -> None:
    """The sync shell: ``run_stream_sync`` in a sync workflow; its decision is committed
    at once. A drive stopped after the text was shown; the resumed drive shows the same
    text and asks nothing."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "models"))
    from model_server import ModelServer, Turn

    shown: list[str] = []

    def workflow(ctx: cp.Context) -> str:
        agent = _streaming_agent(tmp_path, server.url)
        with durable(ctx):
            result = agent.run_stream_sync("note it")
            shown.append("".join(result.stream_text(delta=True)))
            output = result.get_output()
        if len(shown) == 1:
            raise cp.SimulatedCrash("after the answer was shown")
        return output

    with ModelServer(script=[Turn("done")], by_turn=True) as server:
        with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
            wf = ledger.workflow("stream", version="1")(workflow)
            with pytest.raises(cp.SimulatedCrash):
                ledger.run(wf, run_id="r")
            output = ledger.run(wf, run_id="r")
        assert server.count == 1
    assert shown == [output, output]
    assert output.startswith("done")


def test_a_tool_changed_under_a_live_run_freezes_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, crash_on_request=2), "sync")
        with pytest.raises(cp.SimulatedCrash):
            ledger.run(wf, run_id="r", prompt="go")
    changed = make_agent(tmp_path)

    @changed.tool_plain
    def extra(y: str) -> str:
        """A tool the recorded request did not offer."""
        return y

    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, changed, "sync")
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.run(wf, run_id="r", prompt="go")
    assert frozen.value.status == "needs_review"
    assert isinstance(frozen.value.cause, cp.NonDeterminismError)
    assert lines(tmp_path / "asked") == ["1", "3"]  # nothing asked under the changed code
    assert lines(tmp_path / "effects") == ["5", "hi"]


def test_a_model_without_a_stable_identity_is_refused(tmp_path: Path) -> None:
    class Anonymous(TestModel):
        @property
        def model_name(self) -> str:
            return ""

    agent = Agent(Anonymous(), name="anon", capabilities=[CrashproofDurability()])
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:

        @ledger.workflow("anon", version="1")
        def run(ctx: cp.Context) -> str:
            with durable(ctx):
                return agent.run_sync("go").output

        with pytest.raises(cp.RunFailed, match="names no stable model"):
            ledger.run(run, run_id="r")
        assert ledger.get_run("r").steps == ()


# -- approvals: a risky act waits for a signed approval, then runs once -----------------


def test_a_tool_call_waits_for_a_signed_approval_and_runs_once(tmp_path: Path) -> None:
    from crashproof.integrity.signing import generate_keypair

    policy = cp.Policy(
        "agents-1",
        allow={"forge": "1", "pydantic_ai.function": "1"},
        risk={"forge": "high"},
        approval_required={"high"},
    )
    options = cp.RunOptions(policy=policy)
    generate_keypair(tmp_path / "alice.pem")
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        ledger.register_policy(policy)
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.run(wf, run_id="r", prompt="go", options=options)
        assert frozen.value.status == "awaiting_approval"
        assert not (tmp_path / "prs.json").exists()
        pub = (tmp_path / "alice.pem.pub").read_text()
        ledger.add_approver("alice", pub, by="root")
        ledger.approve("r", "adder:model_request/2:open_pr", key=tmp_path / "alice.pem", by="alice")
    with cp.Ledger(url) as ledger:  # approved, resumed in another process
        ledger.register_policy(policy)
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        assert ledger.run(wf, run_id="r", prompt="go", options=options) == "done"
        assert ledger.run(wf, run_id="r", prompt="go", options=options) == "done"
    assert list(json.loads((tmp_path / "prs.json").read_text())) == [
        "r/adder:model_request/2:open_pr"
    ]
    assert lines(tmp_path / "asked") == ["1", "3"]
    assert lines(tmp_path / "effects") == ["5", "hi"]


def test_a_replay_emits_no_span_for_what_it_replays(tmp_path: Path) -> None:
    """pydantic-ai's own instrumentation sits inside the capability: a resumed run
    emits spans for new work only (pydantic-ai + DBOS emits them all again, #6974)."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.models.instrumented import InstrumentationSettings

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = InstrumentationSettings(tracer_provider=provider)
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        agent = make_agent(tmp_path, crash_on_request=2)
        agent.instrument = settings
        with pytest.raises(cp.SimulatedCrash):
            _drive(ledger, workflow(ledger, agent, "sync"), "sync", prompt="go")
    assert [s.name for s in exporter.get_finished_spans()] == [
        "chat function:model:",
        "execute_tool add",
        "execute_tool note",  # the forge's act runs no pydantic-ai tool body: no span
        "chat function:model:",
        "invoke_agent adder",
    ]
    exporter.clear()
    with cp.Ledger(url) as ledger:
        agent = make_agent(tmp_path)
        agent.instrument = settings
        assert _drive(ledger, workflow(ledger, agent, "sync"), "sync", prompt="go") == "done"
    # only the request the crash lost is made (and traced) again
    assert [s.name for s in exporter.get_finished_spans()] == [
        "chat function:model:",
        "invoke_agent adder",
    ]


def test_a_deferred_tool_request_loop_replays_and_runs_the_approved_tool_once(
    tmp_path: Path,
) -> None:
    """pydantic-ai's own human-in-the-loop, chosen with ``approvals="pydantic_ai"`` (the
    default waits for crashproof's signed approval instead: test_approvals.py): a
    ``requires_approval`` tool ends the first run with ``DeferredToolRequests``; the
    workflow answers (here from its input) and runs the agent again; a crash after the
    approved tool ran repeats nothing."""
    from pydantic_ai import DeferredToolRequests, DeferredToolResults
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    deleted: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("delete", {"path": "a"}, tool_call_id="d1")])
        return ModelResponse(parts=[TextPart("deleted")])

    agent = Agent(
        FunctionModel(model),
        name="janitor",
        output_type=[str, DeferredToolRequests],
        capabilities=[CrashproofDurability(approvals="pydantic_ai")],
    )

    @agent.tool_plain(requires_approval=True)
    def delete(path: str) -> str:
        deleted.append(path)
        return f"deleted {path}"

    def janitor(ctx: cp.Context, approve: bool) -> str:
        with durable(ctx):
            first = agent.run_sync("clean up")
            assert isinstance(first.output, DeferredToolRequests)
            answers = DeferredToolResults(
                approvals={call.tool_call_id: approve for call in first.output.approvals}
            )
            second = agent.run_sync(
                message_history=first.all_messages(), deferred_tool_results=answers
            )
        assert isinstance(second.output, str)
        return second.output

    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match="after_commit[step_done:janitor:tool/d1:delete]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        wf = ledger.workflow("janitor", version="1")(janitor)
        with pytest.raises(cp.SimulatedCrash):
            ledger.run(wf, run_id="r", approve=True)
    with cp.Ledger(url) as ledger:
        wf = ledger.workflow("janitor", version="1")(janitor)
        assert ledger.run(wf, run_id="r", approve=True) == "deleted"
        keys = [s.key for s in ledger.get_run("r").steps]
    assert deleted == ["a"]
    assert keys == [
        "janitor:model_request",
        "janitor:tool/d1:delete",
        "janitor:model_request#2",
    ]


def test_a_model_outage_stops_the_run_resumable_and_a_bad_request_fails_it(
    tmp_path: Path,
) -> None:
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    status = {"code": 503}
    asked: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(status["code"])
        if status["code"] != 200:
            raise ModelHTTPError(status["code"], "m", body="down")
        return ModelResponse(parts=[TextPart("up")])

    many = cp.RetryPolicy(attempts=2, retry_on=(cp.Unavailable,))
    with pytest.raises(ValueError, match="tried once per drive"):
        CrashproofDurability(options=cp.StepOptions(retry=many))
    agent = Agent(FunctionModel(model), name="flaky", capabilities=[CrashproofDurability()])

    def flaky(ctx: cp.Context) -> str:
        with durable(ctx):
            return agent.run_sync("go").output

    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = ledger.workflow("flaky", version="1")(flaky)
        with pytest.raises(cp.CrashproofError):
            ledger.run(wf, run_id="r")
        assert ledger.get_run("r").status is not cp.RunStatus.FAILED  # resumable
        assert asked == [503]
        status["code"] = 200
        assert ledger.resume("r") == "up"
        status["code"] = 400
        with pytest.raises(cp.RunFailed, match="down"):
            ledger.run(wf, run_id="r2")
    assert asked == [503, 200, 400]  # a 400 is not retried
