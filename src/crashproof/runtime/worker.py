"""A worker: drives runs pulled from a ledger's queue, N at a time, until stopped.

No control plane. Every worker of every host claims from the same table: the oldest
runnable run (enqueued and never claimed, released, whose driver's lease expired, or
stopped for a retryable cause and due again: store/queue.py) of the workflow versions
it registers, with ``SELECT ... FOR UPDATE SKIP LOCKED`` on
PostgreSQL and one ``BEGIN IMMEDIATE`` on SQLite. A dead worker's runs are taken over by
whichever live worker claims them after their lease runs out; the claim bumps the fencing
token, so a stalled old driver that wakes up can write nothing more. The claim is also the
lease the run is then driven under (``Ledger.drive_claimed``): one claim per pickup.

Nothing waits for a person that a later attempt can clear:

- a run whose worker died is claimed once its lease runs out;
- a run that stopped for a retryable cause (a model, tool or lookup out longer than its
  retries, or an act waiting for another run's unresolved act on the same intent:
  reason ``unavailable:...``) is claimed again with backoff. The worker whose
  attempt stops again stores the next attempt time in the run index
  (``retry_first * 2**n`` seconds after the n-th automatic attempt, at most
  ``retry_max``), so every worker honours it and ``crashproof runs`` shows it;
- a drive that fails for a reason of the store (an outage, a restart, a lost connection)
  leaves the run ``running`` and released (or its lease runs out): any worker claims it
  once the store answers again; this worker leaves it alone as long as a retryable stop
  (``retry_first``, doubling up to ``retry_max``: event ``error`` with ``store`` and
  ``retry_in``);
- pending outbox messages of runs nobody drives are delivered every ``outbox_every``.

A run frozen for a person (``needs_review``: drift, a receipt conflict, non-determinism,
an unknown outcome of a ``review`` tool; ``awaiting_approval``) or stopped for another
reason (a budget) is never claimed: only a signed decision or an operator's resume
moves it.

``stop()`` (SIGTERM/SIGINT in ``crashproof worker``) drains: nothing new is claimed, each
run in flight finishes its current step and stops before the next one (``Draining``),
its lease is released for another worker, and ``serve`` returns.

Each event is one JSON line (``ts``, ``event``, ``worker``, ``run_id``, details) on the
given stream: ``worker_started``, ``claimed``, ``succeeded``, ``failed``, ``frozen``,
``stopped`` (with ``retryable``, and ``next_attempt_at`` and ``retries`` when it is),
``released``, ``lease_lost``, ``lease_held``, ``refused``, ``error``, ``claim_failed``,
``pass_failed``, ``draining``, ``worker_stopped``. ``claimed`` carries ``retry`` (the
automatic attempt number) when it takes on a stopped run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from crashproof.errors import (
    LeaseHeld,
    LedgerError,
    NotALedger,
    PolicyMismatch,
    RunFailed,
    RunFrozen,
    RunStopped,
    SchemaTooNew,
    StaleLeaseError,
)
from crashproof.runtime.async_context import off_loop
from crashproof.runtime.driving.outbox_pass import OutboxPass
from crashproof.runtime.driving.queue import Draining
from crashproof.runtime.guards.binding import LimitsMismatch
from crashproof.runtime.operations.reconciling import ReconcilePass
from crashproof.runtime.options import RunOptions
from crashproof.store.queue import Claimed, queue_store, retryable_stop, runnable_keys
from crashproof.tools.port import Tool

if TYPE_CHECKING:
    from crashproof.runtime.ledger import Ledger

__all__ = ["Worker"]

# A run whose drive failed for a reason of this worker's (a workflow version it cannot
# replay, a bug; a store out is a retryable cause instead: retry_first) is left alone
# for a while, doubling up to a limit, so that one bad run does not spin a worker while
# other runs wait.
BACKOFF_FIRST = 5.0
BACKOFF_MAX = 300.0
# A run stopped for a retryable cause: the default delays before its automatic attempts.
RETRY_FIRST = 5.0
RETRY_MAX = 300.0


class Worker:
    """Drives queued and orphaned runs of ``ledger``'s registered workflows.

    ``concurrency``: runs driven at once (one thread each; agents mostly wait on
    models and tools). ``on_loop``: every run a task of one event loop instead (async
    workflows awaited, sync ones in a worker thread; leases renewed by tasks): for a
    thousand concurrent async agents. ``poll``: seconds between claims while the queue is empty.
    ``until_idle``: return once nothing is runnable and nothing is in flight (batch
    jobs, benchmarks). ``log``: where the JSON-lines events go (default: stderr).
    ``options``: the limits and policy every run it drives must be bound to (recorded
    when the run was enqueued, ``ledger.enqueue(..., options=...)``), checked as
    ``Ledger.run`` checks them for an existing run: a run bound to anything else is
    refused before anything executes (event ``refused``), left to other workers, and
    tried again after a back-off; the policy is registered with the ledger. ``outbox``:
    outbox tools whose pending messages it delivers every ``outbox_every`` seconds
    (runtime/driving/outbox_pass.py). ``reconcile`` and ``reconcile_every``: tools whose
    acts in ended and frozen runs it looks up every so many seconds, journaling each
    finding, at most ``reconcile_limit`` acts a pass (runtime/operations/reconciling.py).
    ``retry_first``, ``retry_max``: the backoff of runs stopped for a retryable cause
    (seconds before the next automatic attempt, doubling from the first, at most the max),
    and of runs whose drive the store failed (an outage, a restart).
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        concurrency: int = 1,
        poll: float = 1.0,
        until_idle: bool = False,
        log: TextIO | None = None,
        options: RunOptions | None = None,
        on_loop: bool = False,
        outbox: Sequence[Tool] = (),
        outbox_every: float = 30.0,
        reconcile: Sequence[Tool] = (),
        reconcile_every: float | None = None,
        reconcile_limit: int = 100,
        retry_first: float = RETRY_FIRST,
        retry_max: float = RETRY_MAX,
    ) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, not {concurrency!r}")
        if not poll > 0:
            raise ValueError(f"poll must be a positive number of seconds, not {poll!r}")
        if not 0 < retry_first <= retry_max:
            raise ValueError(
                f"retry_first and retry_max must be seconds with 0 < first <= max, not "
                f"{retry_first!r} and {retry_max!r}"
            )
        if options is not None and not isinstance(options, RunOptions):
            raise TypeError(f"options must be a cp.RunOptions, not {type(options).__name__}")
        if options is not None and options.policy is not None:
            ledger.register_policy(options.policy)  # runs bound to it find it
        self.options = options
        self.ledger = ledger
        self.outbox = OutboxPass(ledger, outbox, outbox_every)  # pending messages delivered
        self.reconciling = ReconcilePass(
            ledger, reconcile, reconcile_every, self.worker_id, reconcile_limit
        )
        self.concurrency = concurrency
        self.on_loop = on_loop
        self.poll = float(poll)
        self.retry_first = float(retry_first)
        self.retry_max = float(retry_max)
        self.until_idle = until_idle
        self._queue = queue_store(ledger.store)
        self._out = log if log is not None else sys.stderr
        self._out_lock = threading.Lock()
        self._changed = threading.Condition()
        self._stopping = False
        self._in_flight: dict[str, object] = {}  # run id -> its thread, or its task
        self._backoff: dict[str, tuple[float, float]] = {}  # run id -> (until, delay)
        self.completed = 0  # runs this worker drove to an end (succeeded/failed/frozen/stopped)

    @property
    def worker_id(self) -> str:
        return self.ledger.worker_id

    def serve(self) -> int:
        """Claim and drive runs until ``stop()`` (or, with ``until_idle``, until the queue
        is empty); returns 0 once every run in flight stopped and released its lease."""
        workflows = self.ledger.workflows
        if not workflows:
            raise ValueError(
                "the worker's ledger registers no workflows, so it could claim nothing; "
                "register them (CLI: --app MODULE) before serving"
            )
        runnable = runnable_keys(
            (wf.name, version)
            for wf in workflows.values()
            for version in (wf.version, *wf.compatible_with)
        )
        self.emit(
            "worker_started",
            concurrency=self.concurrency,
            poll=self.poll,
            lease_seconds=self.ledger.lease_seconds,
            workflows=sorted(workflows),
            on_loop=self.on_loop,
            **_bound_to(self.options),
        )
        if self.on_loop:
            asyncio.run(self._serve_on_loop(runnable))
            self.emit("worker_stopped", completed=self.completed)
            return 0
        while True:
            claimed = self._next(runnable)
            if claimed is True:
                break
            if claimed is False:
                with self._changed:
                    if not self._stopping:
                        self._changed.wait(self.poll)
                continue
            self._start(claimed)
        self._join()
        self.emit("worker_stopped", completed=self.completed)
        return 0

    async def _serve_on_loop(self, runnable: list[str]) -> None:
        """``serve`` with every run a task of one event loop: async workflows awaited,
        sync ones in a worker thread each; leases renewed by tasks. A claim is a commit:
        made off the loop."""
        tasks: set[asyncio.Task[None]] = set()
        while True:
            claimed = await off_loop(self._next, runnable)
            if claimed is True:
                break
            if claimed is False:  # until a run ends (a free slot) or the poll interval
                if tasks:
                    await asyncio.wait(set(tasks), timeout=self.poll, return_when="FIRST_COMPLETED")
                else:
                    await asyncio.sleep(self.poll)
                continue
            self._announce(claimed)
            task = asyncio.get_running_loop().create_task(self._drive_on_loop(claimed))
            with self._changed:
                self._in_flight[claimed.run_id] = task
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _next(self, runnable: list[str]) -> Claimed | bool:
        """The next run claimed; else True (stop serving: stopping, or idle with
        ``until_idle``) or False (nothing to claim now)."""
        try:  # a store out fails the pass, never the worker: the next one tries again
            if delivered := self.outbox.tick():
                self.emit("outbox_dispatched", delivered=delivered)
            if found := self.reconciling.tick():
                self.emit("reconciled", findings=found)
        except Exception as exc:
            self.emit("pass_failed", error=f"{type(exc).__name__}: {exc}")
        with self._changed:
            if self._stopping:
                return True
            free = len(self._in_flight) < self.concurrency
        claimed = self._claim(runnable) if free else None
        if claimed is not None:
            return claimed
        with self._changed:
            return self.until_idle and free and not self._in_flight

    async def _drive_on_loop(self, claimed: Claimed) -> None:
        started = time.monotonic()
        error: Exception | None = None
        try:
            await self.ledger.drive_claimed_async(claimed, self.options)
        except Exception as exc:
            error = exc
        await off_loop(self._report, claimed, started, error)  # a stop's schedule: a commit

    def stop(self) -> None:
        """Drain: claim nothing more; runs in flight stop after their current step.
        Safe to call from a signal handler or another thread, more than once."""
        with self._changed:
            first = not self._stopping
            self._stopping = True
            self.ledger.draining = True
            self._changed.notify_all()
        if first:
            self.emit("draining", in_flight=sorted(self._in_flight))

    def emit(self, event: str, run_id: str | None = None, **details: Any) -> None:
        """Write one JSON-lines event."""
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        record: dict[str, Any] = {"ts": now, "event": event, "worker": self.worker_id}
        if run_id is not None:
            record["run_id"] = run_id
        record.update(details)
        line = json.dumps(record, default=str, ensure_ascii=False)
        with self._out_lock:
            self._out.write(line + "\n")
            self._out.flush()

    # -- internals ---------------------------------------------------------

    def _claim(self, runnable: list[str]) -> Claimed | None:
        now = time.monotonic()
        with self._changed:
            # A backoff is remembered one more delay past its end, so that the next
            # failure of the run doubles it (forgotten at its end, it never doubled).
            for run_id, (until, delay) in list(self._backoff.items()):
                if until + delay <= now:
                    del self._backoff[run_id]
            waiting = {run_id for run_id, (until, _) in self._backoff.items() if until > now}
            # Never claim a run this worker drives already: the claim would fence it out.
            exclude = sorted({*self._in_flight, *waiting})
        try:
            return self._queue.claim_next(
                self.worker_id, self.ledger.lease_seconds, runnable, exclude=exclude
            )
        except Exception as exc:  # e.g. the database is briefly unreachable: poll again
            self.emit("claim_failed", error=f"{type(exc).__name__}: {exc}")
            return None

    def _announce(self, claimed: Claimed) -> None:
        retry = {"retry": claimed.retry} if claimed.retry else {}
        self.emit(
            "claimed",
            claimed.run_id,
            token=claimed.lease.token,
            lease_expires_at=claimed.lease.expires_at,
            previous_owner=claimed.previous_owner,
            **retry,
        )

    def _start(self, claimed: Claimed) -> None:
        self._announce(claimed)
        thread = threading.Thread(
            target=self._drive,
            args=(claimed,),
            name=f"crashproof-worker:{claimed.run_id}",
            daemon=True,
        )
        with self._changed:
            self._in_flight[claimed.run_id] = thread
        thread.start()

    def _drive(self, claimed: Claimed) -> None:
        started = time.monotonic()
        error: Exception | None = None
        try:
            self.ledger.drive_claimed(claimed, self.options)  # under the claim's lease
        except Exception as exc:
            error = exc
        finally:
            self._report(claimed, started, error)

    def _report(self, claimed: Claimed, started: float, error: Exception | None) -> None:
        """The drive's event (both ways of driving), and its slot freed."""
        run_id = claimed.run_id
        try:
            if error is None:
                self._ended("succeeded", run_id, started)
            elif isinstance(error, Draining):
                self.emit("released", run_id, reason="draining")
            elif isinstance(error, RunFailed):
                self._ended("failed", run_id, started, error=error.error.get("message"))
            elif isinstance(error, RunStopped):
                retry = self._schedule(claimed, error.reason)
                self._ended("stopped", run_id, started, reason=error.reason, **retry)
            elif isinstance(error, RunFrozen):
                self._ended("frozen", run_id, started, status=error.status, reason=error.reason)
            elif isinstance(error, StaleLeaseError):
                self.emit("lease_lost", run_id, error=str(error))
            elif isinstance(error, LeaseHeld):
                self.emit("lease_held", run_id, owner=error.owner, until=error.expires_at)
            elif isinstance(error, PolicyMismatch | LimitsMismatch):  # bound to others
                self.emit("refused", run_id, error=str(error), retry_in=self._back_off(run_id))
            elif _store_out(error):  # a retryable cause: retried as a stop for one is
                message = f"{type(error).__name__}: {error}"
                again = self._back_off(run_id, self.retry_first, self.retry_max)
                self.emit("error", run_id, error=message, retry_in=again, store=True)
            else:
                message = f"{type(error).__name__}: {error}"
                self.emit("error", run_id, error=message, retry_in=self._back_off(run_id))
        finally:
            with self._changed:
                self._in_flight.pop(run_id, None)
                self._changed.notify_all()

    def _schedule(self, claimed: Claimed, reason: str) -> dict[str, Any]:
        """A stop for a retryable cause: store when the next automatic attempt is due
        (``retry_first * 2**n`` after attempt n, at most ``retry_max``; the store's clock);
        the ``stopped`` event's details. A store that cannot take it leaves the run due at
        once: the next claim is then only sooner, never lost."""
        if not retryable_stop("stopped", reason):
            return {"retryable": False}
        delay = min(self.retry_max, self.retry_first * 2.0 ** min(claimed.retry, 62))
        try:
            at = self._queue.schedule_retry(claimed.run_id, delay, claimed.retry)
        except Exception as exc:
            self.emit("error", claimed.run_id, error=f"{type(exc).__name__}: {exc}")
            at = None
        return {"retryable": True, "next_attempt_at": at, "retries": claimed.retry}

    def _back_off(
        self, run_id: str, first: float = BACKOFF_FIRST, most: float = BACKOFF_MAX
    ) -> float:
        """Leave the run alone for a while (doubling each time, up to a limit)."""
        with self._changed:
            delay = min(most, 2 * self._backoff.get(run_id, (0.0, first / 2))[1])
            self._backoff[run_id] = (time.monotonic() + delay, delay)
        return delay

    def _ended(self, event: str, run_id: str, started: float, **details: Any) -> None:
        with self._changed:
            self.completed += 1
            self._backoff.pop(run_id, None)
        self.emit(event, run_id, seconds=round(time.monotonic() - started, 3), **details)

    def _join(self) -> None:
        with self._changed:
            while self._in_flight:
                self._changed.wait(self.poll)


def _store_out(error: Exception) -> bool:
    """Whether a drive failed because the store could not be reached or failed mid-write
    (an outage, a restart, a lost connection): not a ledger that is no ledger or one too
    new for this version, which no later attempt mends."""
    return isinstance(error, LedgerError) and not isinstance(error, NotALedger | SchemaTooNew)


def _bound_to(options: RunOptions | None) -> dict[str, Any]:
    """What ``worker_started`` reports of the worker's options."""
    if options is None:
        return {}
    found: dict[str, Any] = {}
    if options.policy is not None:
        found["policy"] = options.policy.version
    if options.limits is not None:
        found["limits"] = options.limits.to_json()
    return found
