"""``cp.models.tool``: a typed function as a model tool. Its schema from its signature and
docstring (and a clear error naming the tool when there can be none); through the real
SDK clients against the local server, on each API: the derived declarations sent, a
read as a step, ``act=`` a ``cp.Tool`` (one or several acts), ``effect=`` an act
without lookup, and every mistake (an unknown tool, arguments that do not validate, a
tool's own exception) a tool message, never a failed run; crashproof's own errors and
``errors="raise"`` reach the workflow; a crash between an effect and its receipt
settled as the tool declared."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Any, ClassVar

import pytest
from apis import FAST, Api
from model_server import ModelServer, Turn
from pydantic import Field

import crashproof as cp


def test_the_schema_comes_from_the_signature_and_the_docstring() -> None:
    @cp.models.tool
    def commit(message: str, paths: list[str], amend: bool = False) -> str:
        """Commit files.

        Args:
            message: The commit message,
                its first line a summary.
            paths: The files.
        """
        return "ok"

    assert commit.name == "commit"
    assert commit.description == "Commit files."
    assert commit.schema == {
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "description": "The commit message, its first line a summary.",
            },
            "paths": {"type": "array", "items": {"type": "string"}, "description": "The files."},
            "amend": {"type": "boolean", "default": False},
        },
        "required": ["message", "paths"],
        "additionalProperties": False,
    }
    assert commit("m", ["a"]) == "ok"  # still the function

    async def fetch(url: Annotated[str, Field(description="Where.")], json: Any = None) -> str:
        """Fetch a page.

        :param json: A body to send.
        """
        return url

    tool = cp.models.tool(fetch, name="get")
    assert (tool.name, tool.kind, tool.is_async) == ("get", "step", True)
    assert tool.schema["properties"] == {
        "url": {"type": "string", "description": "Where."},
        "json": {"description": "A body to send.", "default": None},  # unannotated: any
    }
    assert tool.arguments({"url": "u"}) == {"url": "u", "json": None}
    with pytest.raises(ValueError, match="url: Input should be a valid string"):
        tool.arguments({"url": 3})
    with pytest.raises(ValueError, match="extra: Extra inputs are not permitted"):
        tool.arguments({"url": "u", "extra": 1})


class Opaque:
    pass


def _star(*paths: str) -> None: ...
def _kw(**options: str) -> None: ...
def _positional(path: str, /) -> None: ...
def _opaque(lock: Opaque) -> None: ...
async def _async_template(x: int) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize(
    ("fn", "kw", "error", "match"),
    [
        (_star, {}, TypeError, "'_star': its signature cannot become a JSON schema: [*]paths"),
        (_kw, {}, TypeError, "'_kw': .*[*][*]options"),
        (_positional, {}, TypeError, "'_positional': .*positional-only"),
        (_opaque, {}, TypeError, "'_opaque': .*parameter 'lock'"),
        (_opaque, {"name": "has space"}, ValueError, "'has space': a tool's name"),
        (_star, {"act": object()}, TypeError, "act= takes cp.Tool"),
        (_star, {"effect": "twice"}, ValueError, "effect='twice': one of review"),
        (_async_template, {"act": cp.Outbox("o", lambda m: None)}, TypeError, "plain def"),
    ],
)
def test_a_tool_that_cannot_be_is_refused_naming_it(
    fn: Any, kw: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        cp.models.tool(fn, **kw)


class Notes(cp.Tool):
    """A target that dedupes by operation id and can look up."""

    name: ClassVar[str] = "notes"
    version: ClassVar[str] = "1"

    def __init__(self, refuse: str = "") -> None:
        self.done: dict[str, str] = {}
        self.refuse = refuse
        self.lock = threading.Lock()

    def execute(self, call: cp.Call) -> cp.Receipt:
        if call.params["text"] == self.refuse:
            raise cp.PermanentError(f"refused {self.refuse!r}")
        with self.lock:
            self.done.setdefault(call.operation_id, call.params["text"])
        return cp.Receipt(call.operation_id, {"noted": call.params["text"]}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        text = self.done.get(call.operation_id)
        return None if text is None else cp.Receipt(call.operation_id, {"noted": text})


CALLS = (
    ("add", '{"a": 1, "b": 2}'),  # 0: a read, a step
    ("nope", "{}"),  # 1: an unknown tool
    ("add", '{"a": "x", "b": 2}'),  # 2: arguments that do not validate
    ("divide", '{"a": 1, "b": 0}'),  # 3: the tool's own exception
    ("note", '{"text": "hi"}'),  # 4: act= a cp.Tool
    ("note", '{"text": "no"}'),  # 5: the cp.Tool refuses (cp.ActFailed)
    ("both", '{"text": "yo"}'),  # 6: two acts
    ("send", '{"to": "ada"}'),  # 7: effect= an act without lookup
)


def _tools(notes: Notes, sent: list[str], on_unknown: str = "at_most_once") -> list[Any]:
    @cp.models.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @cp.models.tool
    def divide(a: float, b: float) -> float:
        return a / b

    @cp.models.tool(act=notes)
    def note(text: str) -> dict[str, Any]:
        """Keep a note."""
        return {"text": text}

    @cp.models.tool(act=[notes, notes])
    def both(text: str) -> list[dict[str, Any]]:
        return [{"text": text}, {"text": text.upper()}]

    @cp.models.tool(effect=on_unknown)
    def send(to: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    return [add, divide, note, both, send]


def _agent(ledger: cp.Ledger, api: Api, client: Any, tools: list[Any]) -> cp.Workflow[Any]:
    def agent(ctx: cp.Context) -> list[Any]:
        llm = api.bind(ctx, client, options=FAST)
        messages: list[Any] = [{"role": "user", "content": "go"}]
        while True:
            reply = llm.create(**api.request(messages), tools=tools)
            messages += llm.reply_messages(reply)
            if not (results := llm.run_tools(reply)):
                return messages
            messages += results

    return ledger.workflow("agent", version="1")(agent)


def _outputs(api: Api, messages: list[Any]) -> list[str]:
    if api.name == "chat":
        return [m["content"] for m in messages if m.get("role") == "tool"]
    if api.name == "responses":
        return [m["output"] for m in messages if m.get("type") == "function_call_output"]
    blocks = [
        b for m in messages if m["role"] == "user" for b in m["content"] if isinstance(b, dict)
    ]
    return [b["content"] for b in blocks if b.get("type") == "tool_result"]


def test_function_tools_on_each_api(api: Api, tmp_path: Path) -> None:
    notes, sent = Notes(refuse="no"), []
    url = f"sqlite:///{tmp_path}/runs.db"
    with ModelServer([Turn("look", CALLS), Turn("done")]) as server:
        client = api.client(server.url, is_async=False)
        with cp.Ledger(url) as ledger:
            messages = ledger.run(_agent(ledger, api, client, _tools(notes, sent)), run_id="r")
        # What the model was sent: the derived declarations, in this API's format.
        declared = server.requests[0]["body"]["tools"]
        assert len(declared) == 5
        schema = _tools(notes, [])[0].schema
        assert declared[0] == _declared(api, "add", "Add two integers.", schema)
        # A restarted process replays everything: no request, no effect again.
        with cp.Ledger(url) as ledger:
            again = ledger.run(_agent(ledger, api, client, _tools(notes, sent)), run_id="r")
        assert server.count == 2
    assert again == messages
    out = _outputs(api, messages)
    assert out[0] == "3"
    assert out[1].startswith("error: there is no tool named 'nope' (the tools are: add, both")
    assert out[2].startswith("error: the arguments of 'add' do not fit its schema (a: Input")
    assert out[3] == "error: ZeroDivisionError: float division by zero"
    assert json.loads(out[4]) == {"noted": "hi"}
    assert out[5].endswith("failed permanently: refused 'no'")  # the target's PermanentError
    assert json.loads(out[6]) == {"noted": "YO"}  # the last act's result
    assert out[7] == "sent to ada"
    assert sorted(notes.done) == [
        "r/" + k for k in sorted(_keys(api, "4:note", "6:both/0", "6:both/1"))
    ]
    assert sent == ["ada"]


def _keys(api: Api, *calls: str) -> list[str]:
    key = {"chat": "chat", "responses": "response", "anthropic": "message"}[api.name]
    return [f"{key}/{c}" for c in calls]


def _declared(api: Api, name: str, text: str, schema: dict[str, Any]) -> dict[str, Any]:
    if api.name == "chat":
        function = {"name": name, "description": text, "parameters": schema}
        return {"type": "function", "function": function}
    if api.name == "responses":  # strict off: the schema says which are required
        return {
            "type": "function",
            "name": name,
            "description": text,
            "parameters": schema,
            "strict": False,
        }
    return {"name": name, "description": text, "input_schema": schema}


@pytest.mark.parametrize("on_unknown", ["at_most_once", "at_least_once", "review"])
def test_a_crash_between_an_effect_and_its_receipt_is_settled_as_declared(
    on_unknown: str, tmp_path: Path
) -> None:
    api, notes, sent = Api("chat"), Notes(), []
    url = f"sqlite:///{tmp_path}/runs.db"
    with ModelServer([Turn("send", (("send", '{"to": "ada"}'),)), Turn("done")]) as server:
        client = api.client(server.url, is_async=False)
        crash = cp.CrashPoints(match="before_commit[step_done:chat/0:send]")
        with cp.Ledger(url, crash_points=crash) as ledger:
            wf = _agent(ledger, api, client, _tools(notes, sent, on_unknown))
            with pytest.raises(cp.SimulatedCrash):
                ledger.run(wf, run_id="r")
        assert sent == ["ada"]  # the effect happened; its receipt did not commit
        with cp.Ledger(url) as ledger:
            wf = _agent(ledger, api, client, _tools(notes, sent, on_unknown))
            if on_unknown == "review":  # a person decides; the model is not asked again
                with pytest.raises(cp.RunFrozen):
                    ledger.resume("r")
                assert (sent, server.count) == (["ada"], 1)
                return
            messages = ledger.resume("r")
    out = _outputs(api, messages)
    if on_unknown == "at_most_once":  # never twice; the model is told
        assert sent == ["ada"]
        assert out[0].startswith("not done: ")
    else:  # at least once: sent again, under the same operation id
        assert sent == ["ada", "ada"]
        assert out == ["sent to ada"]


def test_errors_raise_and_crashproofs_own_errors_reach_the_workflow(tmp_path: Path) -> None:
    api = Api("chat")

    def failing(exc: Exception, errors: str) -> Any:
        def fail() -> str:
            raise exc

        return cp.models.tool(fail, errors=errors)  # type: ignore[arg-type]

    cases = [
        (failing(ValueError("bad"), "raise"), "bad"),
        (failing(cp.LedgerError("the store broke"), "message"), "the store broke"),
    ]
    for n, (tool, message) in enumerate(cases):
        with (
            ModelServer([Turn("fail", (("fail", "{}"),)), Turn("done")]) as server,
            cp.Ledger(f"sqlite:///{tmp_path}/{n}.db") as ledger,
        ):
            wf = _agent(ledger, api, api.client(server.url, is_async=False), [tool])
            with pytest.raises(Exception, match=message) as caught:
                ledger.run(wf, run_id="r")
            assert not isinstance(caught.value, AssertionError)


def test_an_async_effect_in_an_async_workflow(tmp_path: Path) -> None:
    import asyncio

    api, sent = Api("anthropic"), []

    @cp.models.tool(effect=cp.OnUnknown.AT_LEAST_ONCE)
    async def send(to: str) -> dict[str, str]:
        """Send a message."""
        await asyncio.sleep(0)
        sent.append(to)
        return {"to": to}

    async def agent(ctx: cp.AsyncContext) -> list[Any]:
        llm = api.bind(ctx, client, options=FAST)
        messages: list[Any] = [{"role": "user", "content": "go"}]
        while True:
            reply = await llm.create(**api.request(messages), tools=[send])
            messages += llm.reply_messages(reply)
            if not (results := await llm.run_tools(reply)):
                return messages
            messages += results

    with ModelServer([Turn("send", (("send", '{"to": "ada"}'),)), Turn("done")]) as server:
        client = api.client(server.url, is_async=True)
        with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
            wf = ledger.workflow("async-agent", version="1")(agent)
            messages = asyncio.run(ledger.run_async(wf, run_id="r"))
            info = ledger.get_run("r")
    assert sent == ["ada"]
    assert _outputs(api, messages) == ['{"to": "ada"}']
    assert [s.kind.value for s in info.steps] == ["decide", "act", "decide"]
