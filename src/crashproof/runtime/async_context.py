"""The async shell: what an ``async def`` workflow receives as ``ctx``.

Every call goes to the same core as the sync ``Context`` (``context.py``): the key, the
replay match and every record are made there; only the handoffs to user code and tools
are awaited (``runtime/steps/handoff.py``: ``run_async``). A sync and an async drive of
one workflow therefore write the same journal, and either may resume the other's run.

Two rules keep the journal's order the workflow's order:

- ctx calls come from the workflow's own task, one at a time. A task it spawns
  (``asyncio.create_task``, ``gather``, ``wait_for`` on Python 3.11) is refused: its
  calls would be recorded in scheduling order, which the next drive need not repeat.
- a ctx call that is cancelled (``CancelledError``, ``asyncio.timeout``) ends the drive
  as a crash at that point would: nothing of it is recorded, every later ctx call and
  the workflow's return raise ``DriveCancelled``, and the run stays resumable.

A framework that runs its hooks in tasks of its own (pydantic-ai) is let in by
``with ctx.delegated():`` around the await that starts it: while the workflow's task
waits there, any task of the loop may make ctx calls, but still one at a time (a call
while another is in flight is refused), so the order is the framework's own, which it
keeps deterministic (its tools run sequentially).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid as _uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from types import GeneratorType
from typing import Any, TypeVar

from crashproof.errors import AsyncMisuse, DriveCancelled
from crashproof.journal.records import StepKind
from crashproof.runtime.context import Context
from crashproof.runtime.driving.batching import batcher_for, off_loop
from crashproof.runtime.options import StepOptions
from crashproof.runtime.steps.checks import CheckResult, checking
from crashproof.runtime.steps.handoff import run_async
from crashproof.tools.port import Tool

__all__ = ["AsyncContext", "off_loop"]

T = TypeVar("T")


class AsyncContext:
    """Handed to an async workflow as its first argument: ``await ctx.step / decide /
    act``; ``ctx.now() / random() / uuid() / patched()`` as in the sync ``Context``."""

    def __init__(self, core: Context) -> None:
        self._core = core
        core.buffer_commits()  # committed before each handoff (settle)
        self.run_id = core.run_id
        self._task: asyncio.Task[Any] | None = asyncio.current_task()
        # The loop and its thread: current_task() without a loop finds the running one
        # through a getpid() system call, at every ctx call (~2% of a loop of 1,024 runs).
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._batcher = batcher_for(core._host)  # the shell of this core: its host too
        self._ended = False
        self._delegated = 0  # depth of ``delegated()`` blocks open
        self._in_flight = False  # a delegated call is being made
        self.cancelled_at: str | None = None  # the key of the call a cancellation hit

    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T] | T],
        /,
        *args: Any,
        options: StepOptions | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once (awaited when it is a coroutine function, else
        in a worker thread); record its JSON result; replay it afterwards."""
        begin = self._core.begin_call
        return await self._drive(begin, StepKind.STEP, name, fn, args, kwargs, options)  # type: ignore[no-any-return]

    async def decide(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        options: StepOptions | None = None,
        **kwargs: Any,
    ) -> Any:
        """Ask a model once (``fn`` as in ``step``; it may return a ``cp.Decision``). A
        recorded decision is never asked again."""
        return await self._drive(
            self._core.begin_call, StepKind.DECIDE, name, fn, args, kwargs, options
        )

    async def check(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        on: Iterable[Tool] = (),
        options: StepOptions | None = None,
        **kwargs: Any,
    ) -> CheckResult:
        """As ``Context.check``: the task's own check run once (``fn`` as in ``step``), its
        verdict recorded with the environments it saw."""
        core = self._core
        fn = checking(name, fn, on, core.handed)
        value = await self._drive(core.begin_call, StepKind.CHECK, name, fn, args, kwargs, options)
        return CheckResult.from_json(value)

    async def act(self, name: str, tool: Tool, /, **params: Any) -> Any:
        """Perform a side effect through ``tool`` under the act protocol (its methods may
        be ``async def``; plain ones run in a worker thread); returns the receipt's
        result. Operation id ``run_id/step_key``, as in the sync ``Context``."""
        return await self._drive(self._core.begin_act, name, tool, params)

    @property
    def last_key(self) -> str | None:
        """The step key of the latest step, decision or act begun (as ``Context.last_key``):
        what an adapter derives the keys of follow-up calls from (``crashproof.models``)."""
        return self._core.last_key

    def now(self) -> dt.datetime:
        """The current UTC time, recorded: replay returns the same instant."""
        self._own()
        return self._core.now()

    def random(self) -> float:
        """A random float in [0, 1), recorded."""
        self._own()
        return self._core.random()

    def uuid(self) -> _uuid.UUID:
        """A random UUID4, recorded."""
        self._own()
        return self._core.uuid()

    def patched(self, change_id: str) -> bool:
        """As ``Context.patched``: True for runs that reach this point under the new code."""
        self._own()
        return self._core.patched(change_id)

    @contextmanager
    def delegated(self) -> Iterator[None]:
        """While the workflow's task awaits inside this block, ctx calls may come from
        other tasks of its loop (a framework's own), one at a time: a call made while
        another is in flight raises ``AsyncMisuse``, nothing recorded."""
        self._own()
        self._delegated += 1
        try:
            yield
        finally:
            self._delegated -= 1

    # -- the shell ---------------------------------------------------------------

    async def _drive(self, begin: Callable[..., Any], *args: Any) -> Any:
        delegated = self._own()
        if delegated:
            self._in_flight = True
        try:
            work = begin(*args)
            if type(work) is not GeneratorType:
                return work  # replayed: nothing to await
            try:
                return await run_async(work, self.settle)
            except asyncio.CancelledError:
                self.cancelled_at = self._core.last_key or "?"
                raise
        finally:
            if delegated:
                self._in_flight = False

    def _own(self) -> bool:
        """Refuse a call that does not come from the workflow's task (or, inside
        ``delegated()``, from another task while a call is in flight), or after a
        cancel. True when the call is a delegated one."""
        if self.cancelled_at is not None:
            raise DriveCancelled(self.run_id, self.cancelled_at)
        # From another thread (a step's worker thread): no task of the loop's.
        task = asyncio.current_task(self._loop) if threading.get_ident() == self._thread else None
        if task is self._task and not self._ended and not self._in_flight:
            return False
        if self._delegated and task is not None and not self._ended:
            if self._in_flight:  # from another task, or from the workflow's own
                raise AsyncMisuse(
                    f"run {self.run_id!r}: a ctx call was made while another was in flight "
                    "(tasks running in parallel under ctx.delegated()): their order would "
                    "depend on scheduling. Nothing was recorded; run them one at a time"
                )
            return True
        if self._ended:
            raise AsyncMisuse(
                f"run {self.run_id!r}: this drive has ended, so a ctx call from a task that "
                "outlives it records nothing; await every ctx call inside the workflow"
            )
        raise AsyncMisuse(
            f"run {self.run_id!r}: ctx calls must come from the workflow's own task, one at "
            "a time (not from asyncio.create_task, gather, or wait_for on Python 3.11, nor "
            "from inside a step): their order would depend on scheduling, which a resume "
            "need not repeat. Nothing was recorded; await the calls in sequence (for a "
            "deadline, put asyncio.timeout inside the step's function)"
        )

    async def settle(self) -> None:
        """Before a handoff: the records this drive made are committed (the output points
        durable), batched with the other drives' that commit this turn
        (runtime/driving/batching.py): on the loop's thread when the journal is local
        (an output point's fsync then waits in a commit thread), else in a commit
        thread, where the round trip waits; in a commit thread of its own where the
        store has no batch."""
        core, pending = self._core, self._core.pending
        if not pending:
            return
        if self._batcher is not None:
            await self._batcher.commit(core, pending.local)
            return
        if pending.local and not pending.must_sync():
            core.flush()  # a local commit that waits for no disk
        else:
            await off_loop(core.flush)  # a round trip, or a wait for the disk: a thread

    def end(self) -> None:
        """The workflow returned or raised: later calls from tasks it left are refused."""
        self._ended = True
