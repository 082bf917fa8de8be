"""Where a run hands control to code outside it, and the two drivers that do the handing.

The recorders (``acts``, ``environment``, ``reconcile``, ``outbox``, ``live``) and the
guards are written once, as generators: at each point where they call user code or a
tool (a step's function, ``execute``, ``lookup``, ``observe``) or wait, they ``yield`` a
:class:`Invoke`, :class:`InvokeAll` or :class:`Pause` and get its outcome back (a value,
or the exception thrown in at the yield). Everything else (matching, digests, budgets,
policy, the act protocol's records) runs in between, the same for both drivers:

- :func:`run_sync` calls the function, or sleeps, in the caller's thread;
- :func:`run_async` awaits a coroutine function, runs a plain function in a worker
  thread (so a blocking call does not stall the event loop) unless the handoff is
  ``inline``, and sleeps with ``asyncio.sleep``.

This is the "one core, two thin shells" of STYLE.md (habit 4), the way ``h11`` keeps its
protocol free of I/O: there is no ``_async`` twin of any recorder. A sync and an async
drive of the same workflow therefore write the same records.

A cancelled task (``asyncio.CancelledError``) and a crash point (``SimulatedCrash``) are
BaseExceptions: thrown in at the yield, they pass every ``except Exception`` of the
recorders and leave the journal as a crash would.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from crashproof.errors import AsyncMisuse
from crashproof.tools.port import Tool

__all__ = [
    "Invoke",
    "InvokeAll",
    "Outcome",
    "Pause",
    "Settle",
    "Work",
    "async_methods",
    "async_tool_refused",
    "is_async",
    "run_async",
    "run_sync",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call ``fn(*args, **kwargs)``. ``what`` names it in errors ("step 'plan'",
    "execute of tool 'http'"). ``inline``: under the async driver, a plain function that
    does no I/O runs on the loop's thread (a recorded clock, a random number)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    what: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    inline: bool = False


@dataclass(frozen=True, slots=True)
class InvokeAll:
    """Call each of ``calls``, at most ``limit`` at a time; returns one :class:`Outcome`
    each, in order (an exception is an outcome here, not raised)."""

    calls: Sequence[Invoke]
    limit: int


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Settle:
    """Nothing to call: the point where the records made so far must be committed (the
    async shell commits them before every handoff; a refusal of the commit, such as
    ``IntentHeld``, is thrown in here). The sync shell committed them already."""


@dataclass(frozen=True, slots=True)
class Outcome:
    value: Any = None
    error: Exception | None = None


Handoff = Invoke | InvokeAll | Pause | Settle
Work = Generator[Handoff, Any, T]


def is_async(fn: Callable[..., Any]) -> bool:
    """A coroutine function, also behind ``functools.partial``, a bound method or a
    decorator that kept ``__wrapped__``. Asked for every live call: a plain function
    (the usual step) is answered from its code flags alone."""
    code = getattr(fn, "__code__", None)
    if code is not None and "__wrapped__" not in getattr(fn, "__dict__", ()):
        return bool(code.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn))


_TOOL_METHODS = ("prepare", "execute", "lookup", "observe", "expect", "target_of")
_async_methods: dict[type[Tool], tuple[str, ...]] = {}


def async_methods(tool: Tool) -> tuple[str, ...]:
    """The methods of ``tool``'s class that are coroutine functions (declared per class:
    a tool is sync, async, or mixed, never per instance)."""
    cls = type(tool)
    found = _async_methods.get(cls)
    if found is None:
        found = _async_methods[cls] = tuple(
            m for m in _TOOL_METHODS if is_async(getattr(cls, m, None) or _no_method)
        )
    return found


def _no_method() -> None:
    return None


def async_tool_refused(tool: Tool, step: str, methods: tuple[str, ...]) -> AsyncMisuse:
    return AsyncMisuse(
        f"act {step!r}: tool {tool.name!r} has async {'/'.join(methods)} but the run is "
        "driven synchronously; nothing was recorded. Write the workflow as `async def`, "
        "await ctx.act(...), and start it with `await ledger.run_async(...)`, or use a "
        "sync tool"
    )


def run_sync(work: Work[T]) -> T:
    """Drive ``work`` in this thread. An async function it meets is refused before it is
    called (AsyncMisuse: nothing of the call is recorded; the generator is closed)."""
    try:
        handoff = next(work)
        while True:
            try:
                value = _do_sync(handoff)
            except AsyncMisuse:
                work.close()
                raise
            except BaseException as exc:
                handoff = work.throw(exc)
            else:
                handoff = work.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _do_sync(handoff: Handoff) -> Any:
    if type(handoff) is Invoke:
        return _call_sync(handoff)
    if type(handoff) is Pause:
        time.sleep(handoff.seconds)
        return None
    if type(handoff) is Settle:
        return None
    if type(handoff) is InvokeAll:
        for one in handoff.calls:
            if is_async(one.fn):
                raise _refused(one)
        if handoff.limit <= 1 or len(handoff.calls) <= 1:
            return [_outcome_sync(one) for one in handoff.calls]
        workers = max(1, min(handoff.limit, len(handoff.calls)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(_outcome_sync, handoff.calls))
    raise TypeError(f"not a handoff: {handoff!r}")


def _call_sync(invoke: Invoke) -> Any:
    if is_async(invoke.fn):
        raise _refused(invoke)
    value = invoke.fn(*invoke.args, **invoke.kwargs)
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no "was never awaited" warning, nothing ran
        raise _refused(invoke)
    return value


def _outcome_sync(invoke: Invoke) -> Outcome:
    try:
        return Outcome(value=_call_sync(invoke))
    except Exception as exc:
        return Outcome(error=exc)


def _refused(invoke: Invoke) -> AsyncMisuse:
    return AsyncMisuse(
        f"{invoke.what} is async (a coroutine function, or it returned an awaitable) but "
        "the run is driven synchronously; nothing of it was recorded. Write the workflow "
        "as `async def`, await the ctx calls, and start it with `await ledger.run_async(...)`"
        " (or resume it with `await ledger.resume_async(...)`)"
    )


async def run_async(work: Work[T], before: Callable[[], Awaitable[None]] | None = None) -> T:
    """Drive ``work`` on the running event loop. ``before``: awaited before each
    handoff (the output points committed so far are made durable there)."""
    try:
        handoff = next(work)
        while True:
            try:
                if before is not None:
                    await before()
                value = await _do_async(handoff)
            except BaseException as exc:
                handoff = work.throw(exc)
            else:
                handoff = work.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _do_async(handoff: Handoff) -> Awaitable[Any]:
    """What to await for ``handoff``: for a call, the function's own coroutine where it
    has one (no wrapper: each level of coroutines is passed through at every resume)."""
    if type(handoff) is Invoke:
        return _call_async(handoff)
    if type(handoff) is Pause:
        return asyncio.sleep(handoff.seconds)
    if type(handoff) is Settle:
        return _nothing()  # ``before`` committed what was pending
    if type(handoff) is InvokeAll:
        return _all_async(handoff)
    raise TypeError(f"not a handoff: {handoff!r}")


async def _nothing() -> None:
    return None


async def _all_async(handoff: InvokeAll) -> list[Outcome]:
    gate = asyncio.Semaphore(max(1, handoff.limit))

    async def one(invoke: Invoke) -> Outcome:
        async with gate:
            try:
                return Outcome(value=await _call_async(invoke))
            except Exception as exc:
                return Outcome(error=exc)

    return list(await asyncio.gather(*(one(i) for i in handoff.calls)))


def _call_async(invoke: Invoke) -> Awaitable[Any]:
    if is_async(invoke.fn):
        return invoke.fn(*invoke.args, **invoke.kwargs)  # type: ignore[no-any-return]
    return _call_plain(invoke)


async def _call_plain(invoke: Invoke) -> Any:
    """A plain function: in a worker thread (inline where it does no I/O); a coroutine
    it returns is awaited."""
    fn, args, kwargs = invoke.fn, invoke.args, invoke.kwargs
    if invoke.inline:
        value = fn(*args, **kwargs)
    else:
        try:
            value = await asyncio.to_thread(fn, *args, **kwargs)
        except asyncio.CancelledError:
            # The thread runs on; a tool that can stop its work early (cp.Shell kills its
            # command's process group) is told to.
            interrupt = getattr(getattr(fn, "__self__", None), "interrupt", None)
            if callable(interrupt):
                interrupt()
            raise
    if inspect.isawaitable(value):  # a plain function that returned a coroutine
        value = await value
    return value
