"""Function tools of an Agents SDK agent, journaled: a ``cp.Tool`` given for a tool name
is ``ctx.act`` (intent before execute, lookup before any retry; the function's body is
not called), a name in ``effects`` an act without lookup (a crash between its effect and
its receipt is settled as its ``cp.OnUnknown`` says: frozen for review, sent again, or
recorded as not done), any other function tool ``ctx.step`` (its output recorded with
the tool-call id). An act recorded as not done (``cp.ActNotDone``) reaches the model as
the tool's output, ``"not done: ..."``. Keys: ``<model call key>/<index>:<tool>``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

from agents.tool import FunctionTool
from agents.tool_context import ToolContext

import crashproof as cp
from crashproof.integrations._calls_from_loop import function_tool_call
from crashproof.integrations.openai_agents._bridge import Session, bound, ctx_call
from crashproof.integrations.openai_agents._model import to_json
from crashproof.models import FunctionTool as ModelTool

__all__ = ["journaled", "model_tool"]

Invoke = Callable[[ToolContext[Any], str], Awaitable[Any]]


class _Effect(cp.Tool):
    """A function tool's body as an act without lookup."""

    name: ClassVar[str] = "openai_agents.function"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(self, invoke: Invoke, context: ToolContext[Any], session: Session) -> None:
        self.invoke, self.context = invoke, context
        self.loop = asyncio.get_running_loop()
        self.is_async = isinstance(session.ctx, cp.AsyncContext)

    async def _run(self, call: cp.Call) -> cp.Receipt:
        output = await self.invoke(self.context, str(call.params["input"]))
        return cp.Receipt(call.operation_id, to_json(output), call.intent_digest)

    def execute(self, call: cp.Call) -> cp.Receipt:
        return asyncio.run_coroutine_threadsafe(self._run(call), self.loop).result()


class _AsyncEffect(_Effect):
    async def execute(self, call: cp.Call) -> cp.Receipt:  # type: ignore[override]
        return await self._run(call)


def _key(session: Session, context: ToolContext[Any]) -> str:
    index = session.index.get(context.tool_call_id)
    if session.base is None or index is None:
        return f"tool/{context.tool_call_id.replace('#', '.')}:{context.tool_name}"
    return f"{session.base}/{index}:{context.tool_name}"


def journaled(
    tool: FunctionTool, acts: Mapping[str, cp.Tool], effects: Mapping[str, cp.OnUnknown]
) -> FunctionTool:
    """``tool`` with its calls journaled (a copy; ``tool`` is unchanged)."""
    invoke: Invoke = tool.on_invoke_tool
    target = acts.get(tool.name)

    async def on_invoke(context: ToolContext[Any], input_json: str) -> Any:
        session = bound(f"tool {tool.name!r}")
        key = _key(session, context)
        try:
            if target is not None:
                params = json.loads(input_json) if input_json.strip() else {}
                return await ctx_call(session, "act", key, target, **params)
            if tool.name in effects:
                shell = _AsyncEffect if isinstance(session.ctx, cp.AsyncContext) else _Effect
                effect = shell(invoke, context, session)
                effect.on_unknown = effects[tool.name]
                return await ctx_call(session, "act", key, effect, input=input_json)
        except cp.ActNotDone as exc:  # settled as not done: the model is told so
            return f"not done: {exc}"

        async def run(call_id: str, input: str) -> dict[str, Any]:
            return {"tool_call_id": call_id, "output": to_json(await invoke(context, input))}

        record = await ctx_call(
            session, "step", key, run, call_id=context.tool_call_id, input=input_json
        )
        return record["output"]

    return dataclasses.replace(tool, on_invoke_tool=on_invoke)


def model_tool(function: ModelTool) -> FunctionTool:
    """A ``cp.models.tool`` function as the SDK's function tool: its name, description
    and schema (``cp.models.tool``'s, pydantic's, as the SDK derives its own; not made
    strict, so a parameter with a default stays optional), each call run as it declares
    (a step, its ``act=`` tools, an ``effect=``) under ``<model call key>/<index>:<tool>``;
    a wrong call or a tool's error is the tool's output, a message to the model."""

    async def on_invoke(context: ToolContext[Any], input_json: str) -> str:
        session = bound(f"tool {function.name!r}")
        async with session.lock:  # the call's acts, together, in the SDK's order
            text, _ = await function_tool_call(
                session.ctx, function, _key(session, context), context.tool_call_id, input_json
            )
        return text

    return FunctionTool(
        name=function.name,
        description=function.description,
        params_json_schema=function.schema,
        on_invoke_tool=on_invoke,
        strict_json_schema=False,
    )
