"""One ctx call from a coroutine on a framework's event loop, for either kind of workflow
(shared by the pydantic-ai and Agents SDK integrations; it imports neither framework).

A ``cp.AsyncContext`` is awaited in place. A sync ``cp.Context`` blocks, and the work it
wraps (a model request, a tool) must run on the very loop that would be blocked: so the
sync ctx call goes to a worker thread (contextvars copied) while the loop stays free,
and the work is handed back to the loop from there."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

import crashproof as cp
from crashproof.models import FunctionTool, ctx_calls

__all__ = ["ctx_call", "function_tool_call"]


async def ctx_call(
    ctx: cp.Context | cp.AsyncContext,
    method: str,
    name: str,
    work: Callable[..., Coroutine[Any, Any, Any]] | cp.Tool,
    /,
    **kwargs: Any,
) -> Any:
    """``ctx.<method>(name, work, **kwargs)``; ``work`` is a coroutine function (a step or
    a decision) or a ``cp.Tool`` (an act)."""
    if isinstance(ctx, cp.AsyncContext):
        return await getattr(ctx, method)(name, work, **kwargs)
    loop = asyncio.get_running_loop()
    target: Any = work
    if not isinstance(work, cp.Tool) and inspect.iscoroutinefunction(work):
        coroutine_fn = work

        def on_loop(*args: Any, **kw: Any) -> Any:
            # Back on the loop the caller runs on, waiting here in the worker thread.
            return asyncio.run_coroutine_threadsafe(coroutine_fn(*args, **kw), loop).result()

        target = on_loop
    return await asyncio.to_thread(getattr(ctx, method), name, target, **kwargs)


async def function_tool_call(
    ctx: cp.Context | cp.AsyncContext,
    tool: FunctionTool,
    step: str,
    call_id: str,
    arguments: Any,
) -> tuple[str, bool]:
    """A ``cp.models.tool`` function called by a framework's model, journaled under
    ``step``: its text for the model and whether it is an error (``ctx_calls``
    says what each ctx call is)."""
    calls = ctx_calls(tool, step, call_id, arguments)
    value: Any = None
    while True:
        try:
            method, name, work, kwargs = calls.send(value)
        except StopIteration as stop:
            result: tuple[str, bool] = stop.value
            return result
        try:
            value = await ctx_call(ctx, method, name, work, **kwargs)
        except cp.ActFailed as exc:  # recorded, raised again on replay: ctx_calls decides
            value = exc
