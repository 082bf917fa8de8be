"""Each recorder (Chat Completions, Responses, Messages) x sync/async x streamed or not,
through the real SDK clients against a local server: the SDK's type back live and after
a restart (no request then), tokens and cost in the budget, tool calls dispatched to
steps and acts with the model's mistakes answered, not raised."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from apis import FAST, Api
from model_server import ModelServer, Turn

import crashproof as cp

PRICES = {"m": cp.models.Price(input=1.0, output=4.0, cached_input=0.5)}
TOOLS = [
    {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {"name": "note", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
]
CALLS = (
    ("add", '{"a": 1, "b": 2}'),
    ("nope", "{}"),
    ("add", '{"a": "x", "b": 2}'),
    ("add", '{"a": 1, "b": 2'),
    ("note", '{"text": "hi"}'),
)


class Notes(cp.Tool):
    """A target that dedupes by operation id and can look up."""

    name: ClassVar[str] = "notes"
    version: ClassVar[str] = "1"

    def __init__(self) -> None:
        self.done: dict[str, str] = {}
        self.executed = 0

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.executed += 1
        self.done.setdefault(call.operation_id, call.params["text"])
        return cp.Receipt(call.operation_id, {"noted": call.params["text"]}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if call.operation_id not in self.done:
            return None
        return cp.Receipt(
            call.operation_id, {"noted": self.done[call.operation_id]}, call.intent_digest
        )


def add(a: int, b: int) -> int:
    return a + b


def _workflow(
    ledger: cp.Ledger,
    api: Api,
    client: Any,
    notes: Notes,
    *,
    is_async: bool,
    stream: bool,
    events: list[Any],
) -> cp.Workflow[Any]:
    handlers = {"add": add, "note": notes}
    kw = {"on_event": events.append} if stream else {}

    def record(out: dict[str, Any], reply: Any, results: list[Any]) -> None:
        out["types"].append(type(reply).__name__)
        out["texts"].append(api.text(reply))
        out["results"].append(results)

    if is_async:

        async def agent_async(ctx: cp.AsyncContext) -> dict[str, Any]:
            llm = api.bind(ctx, client, prices=PRICES, options=FAST)
            messages: list[Any] = [{"role": "user", "content": "go"}]
            out: dict[str, Any] = {"types": [], "texts": [], "results": []}
            for _ in range(3):
                reply = await llm.create(**api.request(messages, TOOLS), **kw)
                messages += llm.reply_messages(reply)
                results = await llm.run_tools(reply, handlers)
                record(out, reply, results)
                if not results:
                    break
                messages += results
            return out

        return ledger.workflow("agent", version="1")(agent_async)

    def agent(ctx: cp.Context) -> dict[str, Any]:
        llm = api.bind(ctx, client, prices=PRICES, options=FAST)
        messages: list[Any] = [{"role": "user", "content": "go"}]
        out: dict[str, Any] = {"types": [], "texts": [], "results": []}
        for _ in range(3):
            reply = llm.create(**api.request(messages, TOOLS), **kw)
            messages += llm.reply_messages(reply)
            results = llm.run_tools(reply, handlers)
            record(out, reply, results)
            if not results:
                break
            messages += results
        return out

    return ledger.workflow("agent", version="1")(agent)


def _drive(ledger: cp.Ledger, wf: cp.Workflow[Any], *, is_async: bool, resume: bool = False) -> Any:
    if is_async:
        call = ledger.resume_async("r") if resume else ledger.run_async(wf, run_id="r")
        return asyncio.run(call)
    return ledger.resume("r") if resume else ledger.run(wf, run_id="r")


def _outputs(api: Api, results: list[Any]) -> list[str]:
    if api.name == "chat":
        return [m["content"] for m in results]
    if api.name == "responses":
        return [m["output"] for m in results]
    return [b["content"] for b in results[0]["content"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_an_agent_loop_records_decisions_and_replays_sdk_types(
    api: Api, is_async: bool, stream: bool, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    notes, events = Notes(), []
    first = f"{api_key(api)}#2"
    with ModelServer([Turn("look", CALLS), Turn("done")]) as server:
        client = api.client(server.url, is_async=is_async)
        crash = cp.CrashPoints(match=f"after_commit[step_done:{first}]")
        with cp.Ledger(url, crash_points=crash) as ledger:
            wf = _workflow(
                ledger, api, client, notes, is_async=is_async, stream=stream, events=events
            )
            with pytest.raises(cp.SimulatedCrash):
                _drive(ledger, wf, is_async=is_async)
        assert server.count == 2
        if stream:  # the SDK's own events, each as it came
            assert len(events) > 5
            assert all(type(e).__module__.startswith(("openai.", "anthropic.")) for e in events)
            assert all(r["body"]["stream"] is True for r in server.requests)
        # A new ledger (a restarted process) replays both decisions: no request at all.
        seen = len(events)
        with cp.Ledger(url) as ledger:
            wf = _workflow(
                ledger, api, client, notes, is_async=is_async, stream=stream, events=events
            )
            out = _drive(ledger, wf, is_async=is_async, resume=True)
            info = ledger.get_run("r")
        assert server.count == 2
        assert len(events) == seen  # replay presents the recorded response whole
    assert out["types"] == [api.reply_type] * 2
    assert out["texts"][1].startswith("done [")
    outputs = _outputs(api, out["results"][0])
    assert outputs[0] == "3"
    assert outputs[1].startswith("error: there is no tool named 'nope'")
    assert "do not fit its schema" in outputs[2]
    assert "'x' is not of type 'integer'" in outputs[2]
    assert "not valid JSON" in outputs[3]
    assert json.loads(outputs[4]) == {"noted": "hi"}
    assert notes.executed == 1
    key = api_key(api)
    assert [(s.key, s.kind.value) for s in info.steps] == [
        (key, "decide"),
        (f"{key}/0:add", "step"),
        (f"{key}/1", "step"),
        (f"{key}/2:add", "step"),
        (f"{key}/3:add", "step"),
        (f"{key}/4:note", "act"),
        (first, "decide"),
    ]
    note_step = next(s for s in info.steps if s.kind.value == "act")
    assert note_step.operation_id == f"r/{key}/4:note"
    assert info.budget.decisions == 2
    body_tokens = [len(json.dumps(r["body"])) // 4 for r in server.requests]
    cached = {"chat": 3, "responses": 2, "anthropic": 4}[api.name]
    # Anthropic counts cache reads beside input_tokens: the recorder adds them in.
    inputs = [t + cached if api.name == "anthropic" else t for t in body_tokens]
    assert info.budget.tokens == sum(inputs) + 2 * 7
    expected = sum((t - cached) * 1.0 + cached * 0.5 + 7 * 4.0 for t in inputs) / 1e6
    assert info.budget.cost == pytest.approx(expected)


def api_key(api: Api) -> str:
    return {"chat": "chat", "responses": "response", "anthropic": "message"}[api.name]


def test_import_crashproof_imports_no_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys, crashproof as cp; assert 'openai' not in sys.modules; "
        "assert 'anthropic' not in sys.modules; cp.models.Price(input=1, output=1); "
        "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_sync_context_refuses_an_async_client_and_back(tmp_path: Path) -> None:
    with ModelServer([]) as server, cp.Ledger("memory://") as ledger:
        sync_client = Api("chat").client(server.url, is_async=False)
        async_client = Api("chat").client(server.url, is_async=True)

        @ledger.workflow("mixed", version="1")
        def mixed(ctx: cp.Context) -> None:
            cp.models.openai_chat(ctx, async_client)

        with pytest.raises(cp.AsyncMisuse, match="needs the SDK's sync client"):
            ledger.run(mixed, run_id="m")

        @ledger.workflow("mixed2", version="1")
        async def mixed2(ctx: cp.AsyncContext) -> None:
            cp.models.openai_chat(ctx, sync_client)

        with pytest.raises(cp.AsyncMisuse, match="needs the SDK's async client"):
            asyncio.run(ledger.run_async(mixed2, run_id="m2"))
        assert server.count == 0


def test_an_sdk_object_in_the_messages_is_refused_before_any_request() -> None:
    with ModelServer([Turn("a")]) as server, cp.Ledger("memory://") as ledger:
        client = Api("chat").client(server.url, is_async=False)

        @ledger.workflow("w", version="1")
        def w(ctx: cp.Context) -> str:
            llm = cp.models.openai_chat(ctx, client)
            messages: list[Any] = [{"role": "user", "content": "x"}]
            reply = llm.create(model="m", messages=messages)
            messages.append(reply.choices[0].message)
            try:
                llm.create(model="m", messages=messages)
            except cp.SerializationError as exc:
                return str(exc)
            return "sent"

        said = ledger.run(w, run_id="x")
        assert server.count == 1
    assert "Append llm.reply_messages(reply)" in said
