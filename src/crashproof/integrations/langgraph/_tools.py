"""LangChain tools for LangGraph's prebuilt ``ToolNode`` (and so ``create_react_agent``),
each call journaled through ``NodeCalls``.

``durable_tools(calls, tools)`` returns one ``BaseTool`` per tool, with the tool's own
name, description and argument schema (the model sees the same tool), whose call is:

- a name in ``acts``: ``calls.act`` with that ``cp.Tool`` and the model's arguments as
  params, or what ``params[name]`` makes of them (``lambda args: {"body": args}`` for an
  ``HttpTool``): intent before execute, lookup before any retry; the tool's function is
  not called;
- a name in ``reads``: the tool run as a recorded step (``calls.decide``: its result is
  recorded with the tool-call id and replayed; a crash before the record runs it again);
- any other tool: an act without lookup (``calls.act``) whose body is the tool itself;
  a crash between its effect and its receipt is settled as ``on_unknown`` says for that
  name (default: the ``NodeCalls``' own, ``review``).

The call's identity is the tool-call id the recorded model message fixes, so the node
LangGraph runs again after a crash finds each recorded result instead of calling again.
Only the model's arguments are the act's params: values ``ToolNode`` injects
(``InjectedState``, ``InjectedStore``, ``ToolRuntime``) reach the tool live and are not
journaled.

A tool that raises: ``cp.OutcomeUnknown`` / ``cp.RetryableError`` /
``cp.PermanentError`` keep the core's meaning; any other exception is the tool's answer,
recorded once as an error message and replayed as one: ``errors="message"`` (the
default) gives it to the model as a ``ToolMessage`` with ``status="error"``,
``errors="raise"`` raises ``ToolException`` into ``ToolNode``, whose
``handle_tool_errors`` decides. Arguments that do not fit the tool's schema are refused
before anything is journaled (``ToolNode`` turns that into a message to the model).

A ``cp.models.tool`` function in ``tools`` becomes a tool with its name, description
and schema, each call run as it declares (a step: a recorded read; its ``act=`` tools;
an ``effect=``), through ``NodeCalls`` under the tool-call id (``<id>/<j>`` for the j-th
of several acts); arguments that do not fit, its own error and an act's failure reach
the model as a ``ToolMessage`` with ``status="error"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Literal

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from langchain_core.tools import tool as as_tool
from pydantic import BaseModel

import crashproof as cp
from crashproof.integrations.langgraph._calls import NodeCalls
from crashproof.models import FunctionTool as ModelTool
from crashproof.models import ctx_calls

__all__ = ["durable_tools"]

_CORE_ERRORS = (cp.OutcomeUnknown, cp.RetryableError, cp.PermanentError)


class _Effect(cp.Tool):
    """A LangChain tool's body as an act without lookup (one class per tool name, so
    the intent binds the tool's name)."""

    supports_lookup: ClassVar[bool] = False

    def __init__(self, run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.run = run

    def execute(self, call: cp.Call) -> cp.Receipt:
        return cp.Receipt(
            call.operation_id, self.run(dict(call.params["args"])), call.intent_digest
        )


def _effect_class(name: str) -> type[_Effect]:
    return type(f"Effect_{name}", (_Effect,), {"name": f"langchain.{name}", "version": "1"})


def _model_keys(tool: BaseTool) -> set[str] | None:
    """The arguments the model fills (the injected ones left out); None: unknown."""
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return set(schema.model_fields)
    if isinstance(schema, dict):
        return set((schema.get("properties") or {}).keys())
    return None


class _DurableTool(BaseTool):
    """``inner`` with each call journaled (see the module docstring)."""

    inner: BaseTool
    calls: Any  # NodeCalls (not a pydantic type)
    mode: Literal["act", "read", "effect"]
    target: Any = None  # the cp.Tool of an act, or the _Effect class of an effect
    on_unknown: cp.OnUnknown = cp.OnUnknown.REVIEW
    errors: Literal["message", "raise"] = "message"
    to_params: Any = None  # an act's params from the model's arguments

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke overrides
        raise NotImplementedError("a durable tool is called through invoke/ainvoke")

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        call, params = self._call(input)
        record = self._journal(call, params, config, lambda args: self._live(call, args, config))
        return self._message(call, record)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        call, params = self._call(input)
        loop = asyncio.get_running_loop()

        def live(args: dict[str, Any]) -> dict[str, Any]:
            # On the graph's loop, waiting here in the worker thread the ledger runs in.
            coro = self._alive(call, args, config)
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        record = await asyncio.to_thread(self._journal, call, params, config, live)
        return self._message(call, record)

    # -- one call ---------------------------------------------------------------------

    def _call(self, input: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        if not (isinstance(input, dict) and input.get("type") == "tool_call"):
            raise ValueError(
                f"durable tool {self.name!r} runs a model's tool call (ToolNode passes one, "
                "with its id); it was called with plain arguments, so nothing was journaled"
            )
        args = dict(input.get("args") or {})
        keys = _model_keys(self.inner)
        params = {k: v for k, v in args.items() if keys is None or k in keys}
        schema = self.inner.tool_call_schema
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            schema.model_validate(params)  # a ValidationError: ToolNode tells the model
        return dict(input), params

    def _journal(
        self,
        call: dict[str, Any],
        params: dict[str, Any],
        config: RunnableConfig | None,
        live: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> dict[str, Any]:
        calls: NodeCalls = self.calls
        conf: Mapping[str, Any] = config or {}
        call_id = str(call.get("id") or "")
        if not call_id:
            raise ValueError(f"durable tool {self.name!r}: the tool call has no id")
        extra = {k: v for k, v in call["args"].items() if k not in params}

        def run(args: dict[str, Any]) -> dict[str, Any]:
            return live({**args, **extra})

        if self.mode == "act":
            given = self.to_params(params) if self.to_params is not None else params
            try:
                return {"output": calls.act(conf, call_id, self.target, **given)}
            except cp.ActNotDone as exc:
                return {"error": f"not done: {exc}"}
        if self.mode == "read":
            reader = _named(run, f"read.{self.name}")
            value: dict[str, Any] = calls.decide(conf, call_id, reader, args=params)
            return value
        effect = self.target(run)
        effect.on_unknown = self.on_unknown
        try:
            result: dict[str, Any] = calls.act(conf, call_id, effect, args=params)
            return result
        except cp.ActNotDone as exc:
            return {"error": f"not done: {exc}"}

    def _live(
        self, call: dict[str, Any], args: dict[str, Any], config: RunnableConfig | None
    ) -> dict[str, Any]:
        try:
            out = self.inner.invoke({**call, "args": args}, config)
        except _CORE_ERRORS:
            raise
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return _output(self.name, out)

    async def _alive(
        self, call: dict[str, Any], args: dict[str, Any], config: RunnableConfig | None
    ) -> dict[str, Any]:
        try:
            out = await self.inner.ainvoke({**call, "args": args}, config)
        except _CORE_ERRORS:
            raise
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return _output(self.name, out)

    def _message(self, call: dict[str, Any], record: dict[str, Any]) -> ToolMessage:
        call_id = str(call["id"])
        if "error" in record:
            if self.errors == "raise":
                raise ToolException(str(record["error"]))
            return ToolMessage(
                str(record["error"]), name=self.name, tool_call_id=call_id, status="error"
            )
        output = record.get("output")
        if isinstance(output, dict) and set(output) <= {"content", "status", "artifact"}:
            return ToolMessage(
                output.get("content", ""),
                artifact=output.get("artifact"),
                name=self.name,
                tool_call_id=call_id,
                status=output.get("status", "success"),
            )
        content = output if isinstance(output, str | list) else _text(output)
        return ToolMessage(content, name=self.name, tool_call_id=call_id)


class _ModelTool(BaseTool):
    """A ``cp.models.tool`` function called by ``ToolNode`` (see the module docstring)."""

    function: Any  # ModelTool (not a pydantic type)
    calls: Any  # NodeCalls

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke overrides
        raise NotImplementedError("a durable tool is called through invoke/ainvoke")

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if not (isinstance(input, dict) and input.get("type") == "tool_call" and input.get("id")):
            raise ValueError(
                f"durable tool {self.name!r} runs a model's tool call (ToolNode passes one, "
                "with its id); it was called with plain arguments, so nothing was journaled"
            )
        calls: NodeCalls = self.calls
        conf: Mapping[str, Any] = config or {}
        call_id = str(input["id"])
        steps = ctx_calls(self.function, call_id, call_id, dict(input.get("args") or {}))
        value: Any = None
        while True:
            try:
                method, name, work, params = steps.send(value)
            except StopIteration as stop:
                text, failed = stop.value
                break
            try:
                if method == "act":
                    value = calls.act(conf, name, work, **params)
                else:  # a step: a recorded read, named after the tool
                    read = _named(lambda kwargs, run=work: run(**kwargs), f"read.{self.name}")
                    value = calls.decide(conf, name, read, args=params)
            except cp.ActFailed as exc:  # recorded with the call's run: raised again on replay
                value = exc
        status: Literal["success", "error"] = "error" if failed else "success"
        return ToolMessage(text, name=self.name, tool_call_id=call_id, status=status)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.invoke, input, config)


def _output(name: str, out: Any) -> dict[str, Any]:
    """What a tool invoked with a tool call returned, as JSON to record."""
    if isinstance(out, ToolMessage):
        body: dict[str, Any] = {"content": out.content, "status": out.status}
        if out.artifact is not None:
            body["artifact"] = out.artifact
        return {"output": body}
    raise cp.SerializationError(
        f"tool {name!r} returned {type(out).__name__}, not a ToolMessage (a tool returning a "
        "Command cannot be journaled by durable_tools); nothing was recorded"
    )


def _text(value: Any) -> str:
    import json

    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    # NodeCalls names a function by its qualified name, which is the call's input.
    def reader(args: dict[str, Any]) -> Any:
        return fn(args)

    reader.__qualname__ = name
    return reader


def durable_tools(
    calls: NodeCalls,
    tools: Sequence[BaseTool | ModelTool | Callable[..., Any]],
    *,
    acts: Mapping[str, cp.Tool] | None = None,
    params: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
    reads: Collection[str] = (),
    on_unknown: Mapping[str, cp.OnUnknown | str] | None = None,
    errors: Literal["message", "raise"] = "message",
) -> list[BaseTool]:
    """``tools`` (LangChain tools, plain typed functions or ``cp.models.tool`` functions,
    which run as they declare, the options below aside), each call journaled in
    ``calls``' ledger; hand the result to ``ToolNode`` or ``create_react_agent``::

        agent = create_react_agent(durable_model(calls, model),
                                   durable_tools(calls, [run_tests, open_pr],
                                                 reads={"run_tests"}),
                                   checkpointer=saver)

    ``acts``: tool name -> the ``cp.Tool`` that performs it (with a lookup); ``params``:
    tool name -> the act's params made from the model's arguments; ``reads``:
    names of read-only tools (recorded steps); ``on_unknown``: tool name -> what an
    unknown outcome of that effect means; ``errors``: a tool's error as a message to the
    model (``"message"``) or raised into ``ToolNode`` (``"raise"``)."""
    if errors not in ("message", "raise"):
        raise ValueError(f"durable_tools: errors={errors!r}: 'message' or 'raise'")
    acts = dict(acts or {})
    meanings = {k: cp.OnUnknown(v) for k, v in (on_unknown or {}).items()}
    out: list[BaseTool] = []
    names: set[str] = set()
    for given in tools:
        if isinstance(given, ModelTool):
            if given.name in names:
                raise ValueError(f"durable_tools: two tools are named {given.name!r}")
            names.add(given.name)
            out.append(
                _ModelTool(
                    name=given.name,
                    description=given.description,
                    args_schema=given.schema,
                    function=given,
                    calls=calls,
                )
            )
            continue
        inner = given if isinstance(given, BaseTool) else as_tool(given)
        name = inner.name
        if name in names:
            raise ValueError(f"durable_tools: two tools are named {name!r}")
        names.add(name)
        if name in acts and not isinstance(acts[name], cp.Tool):
            raise TypeError(f"durable_tools: acts[{name!r}] is not a cp.Tool")
        mode: Literal["act", "read", "effect"] = (
            "act" if name in acts else "read" if name in reads else "effect"
        )
        out.append(
            _DurableTool(
                name=name,
                description=inner.description,
                args_schema=inner.args_schema,
                return_direct=inner.return_direct,
                inner=inner,
                calls=calls,
                mode=mode,
                target=acts[name] if mode == "act" else _effect_class(name),
                on_unknown=meanings.get(name, calls.on_unknown),
                errors=errors,
                to_params=(params or {}).get(name),
            )
        )
    unknown = (set(acts) | set(reads) | set(meanings) | set(params or {})) - names
    if unknown:
        raise ValueError(f"durable_tools: no tool named {sorted(unknown)!r} was given")
    return out
