"""One ctx call from inside pydantic-ai's event loop, for either kind of workflow.

pydantic-ai calls its hooks on an event loop: the workflow's own in an ``async def``
workflow (``await agent.run(...)``), or the loop ``agent.run_sync`` runs in the
workflow's thread. A ``cp.AsyncContext`` is awaited in place. A sync ``cp.Context`` blocks, and the
work it wraps (the model request, the tool) must run on the very loop that is blocked;
so the sync ctx call goes to a worker thread (contextvars copied) while the loop stays
free, and the work is handed back to the loop from there. pydantic-ai runs its hooks in
tasks of its own, so ``durable`` opens ``ctx.delegated()`` for an async ctx. The journal
sees one call at a time either way: tools run sequentially under this capability.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import crashproof as cp

__all__ = ["bound", "ctx_call", "durable"]

_CTX: contextvars.ContextVar[cp.Context | cp.AsyncContext | None] = contextvars.ContextVar(
    "crashproof_pydantic_ai_ctx", default=None
)


@contextmanager
def durable(ctx: cp.Context | cp.AsyncContext) -> Iterator[None]:
    """Inside this block, agents carrying ``CrashproofDurability`` journal their model
    requests and tool calls in ``ctx``'s run::

        with durable(ctx):
            result = await agent.run("...")   # or agent.run_sync in a sync workflow
    """
    if not isinstance(ctx, cp.Context | cp.AsyncContext):
        raise TypeError(f"durable() takes a cp.Context or cp.AsyncContext, not {ctx!r}")
    token = _CTX.set(ctx)
    try:
        if isinstance(ctx, cp.AsyncContext):
            # pydantic-ai runs its hooks in tasks of its own; they call ctx one at a time.
            with ctx.delegated():
                yield
        else:
            yield
    finally:
        _CTX.reset(token)


def bound() -> cp.Context | cp.AsyncContext | None:
    """The ctx of the enclosing ``durable`` block, if any."""
    return _CTX.get()


async def ctx_call(
    ctx: cp.Context | cp.AsyncContext,
    method: str,
    name: str,
    work: Callable[..., Coroutine[Any, Any, Any]] | cp.Tool,
    /,
    **kwargs: Any,
) -> Any:
    """``ctx.<method>(name, work, **kwargs)`` from a coroutine on pydantic-ai's loop.
    ``work`` is a coroutine function (a step or a decision) or a ``cp.Tool`` (an act)."""
    if isinstance(ctx, cp.AsyncContext):
        return await getattr(ctx, method)(name, work, **kwargs)
    loop = asyncio.get_running_loop()
    target: Any = work
    if not isinstance(work, cp.Tool):
        coroutine_fn = work

        def on_loop(*args: Any, **kw: Any) -> Any:
            # Back on the loop this hook runs on, waiting here in the worker thread.
            return asyncio.run_coroutine_threadsafe(coroutine_fn(*args, **kw), loop).result()

        target = on_loop
    return await asyncio.to_thread(getattr(ctx, method), name, target, **kwargs)
