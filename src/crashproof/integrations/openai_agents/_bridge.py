"""The ctx of the enclosing ``durable(ctx)`` block, and one ctx call from a coroutine
on the Agents SDK's loop (made by ``integrations/_calls_from_loop.py``, shared with the
pydantic-ai integration).

An async ctx is awaited in place, inside ``ctx.delegated()`` (the SDK runs tools in
tasks of its own); a lock keeps its calls one at a time in the order the SDK's tasks
reach it (the order it created them: ``asyncio.gather`` over the response's tool
calls). A sync ctx (``Runner.run_sync`` in a sync workflow) is called from a worker
thread while the loop stays free, and the work goes back to the loop from there.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import crashproof as cp
from crashproof.integrations._calls_from_loop import ctx_call as call_from_loop

__all__ = ["Session", "bound", "ctx_call", "durable"]


@dataclass
class Session:
    """One ``durable`` block: its ctx, the step key of the latest model response and
    the index of each of its tool calls (what tool-call keys derive from)."""

    ctx: cp.Context | cp.AsyncContext
    base: str | None = None
    index: dict[str, int] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "crashproof_openai_agents_session", default=None
)


@contextmanager
def durable(ctx: cp.Context | cp.AsyncContext) -> Iterator[None]:
    """Inside this block, agents made by ``durable_agent`` journal their model calls
    and tool calls in ``ctx``'s run (``await Runner.run(...)``, or ``Runner.run_sync``
    in a sync workflow)."""
    if not isinstance(ctx, cp.Context | cp.AsyncContext):
        raise TypeError(f"durable() takes a cp.Context or cp.AsyncContext, not {ctx!r}")
    token = _SESSION.set(Session(ctx))
    try:
        if isinstance(ctx, cp.AsyncContext):
            with ctx.delegated():
                yield
        else:
            yield
    finally:
        _SESSION.reset(token)


def bound(what: str) -> Session:
    session = _SESSION.get()
    if session is None:
        raise cp.CrashproofError(
            f"{what} runs outside a crashproof workflow: call Runner.run / run_sync inside "
            "`with durable(ctx):` in the workflow. Nothing was sent"
        )
    return session


async def ctx_call(
    session: Session,
    method: str,
    name: str,
    work: Callable[..., Coroutine[Any, Any, Any]] | cp.Tool,
    /,
    **kwargs: Any,
) -> Any:
    """``ctx.<method>(name, work, **kwargs)``, one at a time, from the SDK's loop."""
    async with session.lock:
        return await call_from_loop(session.ctx, method, name, work, **kwargs)
