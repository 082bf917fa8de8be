"""One ctx call from inside pydantic-ai's event loop, for either kind of workflow.

pydantic-ai calls its hooks on an event loop: the workflow's own in an ``async def``
workflow (``await agent.run(...)``), or the loop ``agent.run_sync`` runs in the
workflow's thread (``integrations/_calls_from_loop.py`` makes the call). pydantic-ai
runs its hooks in tasks of its own, so ``durable`` opens ``ctx.delegated()`` for an
async ctx. The journal sees one call at a time either way: tools run sequentially under
this capability.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import crashproof as cp
from crashproof.integrations._calls_from_loop import ctx_call

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
