"""The Ledger as a work queue: enqueue runs for workers, read who holds which run, and
stop driving at the next step boundary when a worker drains. A mixin of ``Ledger``.

An enqueued run is recorded exactly as ``Ledger.run`` records a start (the same
``run_started`` record, the same idempotency and RunConflict rules) and then left
``running`` with no owner. There is no separate ``queued`` state in the journal, and
this is deliberate: the journal is the truth and the index row only a cache, so a run
waiting for its first worker and a run whose worker died (or released it while
draining) are the same thing, a run that needs a driver; one claim query serves both,
and no journal format change is needed. ``crashproof runs`` tells them apart by owner
and lease.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from crashproof.errors import CrashproofError
from crashproof.runtime.driving.leases import Grant, adopt, claim, release
from crashproof.runtime.driving.lifecycle import Started
from crashproof.runtime.driving.resuming import LedgerResume
from crashproof.runtime.options import RunOptions
from crashproof.runtime.workflow import Workflow
from crashproof.store.port import Lease
from crashproof.store.queue import Claimed, LeaseInfo, queue_store

__all__ = ["Draining", "LedgerQueue"]

R = TypeVar("R")


class Draining(CrashproofError):
    """Raised at a run's next step boundary once its Ledger drains (a worker stopping):
    the current step finished and was recorded, nothing new starts, and the run stays
    resumable; its lease is released so another worker picks it up."""


class LedgerQueue(LedgerResume):
    """Queue operations of a Ledger (see the module docstring): a claimed run is driven
    as a resume is."""

    worker_id: str
    lease_seconds: float
    # Leases a worker claimed from the queue, by run id, until the run's drive takes one.
    _claimed: dict[str, Lease]

    def _record(
        self,
        wf: Workflow[R] | str,
        run_id: str,
        options: RunOptions | None,
        input: dict[str, Any],
        *,
        is_async: bool | None = None,
    ) -> tuple[Workflow[R], Started | None]:
        raise NotImplementedError  # provided by Ledger

    def enqueue(
        self,
        wf: Workflow[R] | str,
        /,
        *,
        run_id: str,
        options: RunOptions | None = None,
        **input: Any,
    ) -> None:
        """Record the run ``run_id`` for a worker (``crashproof worker``) to drive, without
        driving it here. Same rules as ``run``: the same run id with the same input is
        a no-op (the run keeps its state, ended or not); with another input it raises
        RunConflict and records nothing. Durable when it returns (in ``output``
        durability too: a sync): the return tells the caller a worker will drive the run,
        and a store crash that then lost the record would leave nothing to drive (#38:
        a PostgreSQL restart just after an enqueue lost the run)."""
        self._record(wf, run_id, options, input)
        self._store.sync()

    def leases(self) -> dict[str, LeaseInfo]:
        """Who holds each run (owner, lease expiry, fencing token), by run id."""
        return queue_store(self._store).leases()

    def drive_claimed(self, claimed: Claimed, options: RunOptions | None = None) -> Any:
        """Drive a run claimed from the queue (``claim_next``) under that claim's lease:
        one claim per queued run, not a second one by ``resume``. ``options``: the limits
        and policy the run must be bound to, checked as ``Ledger.run`` checks them for an
        existing run (else PolicyMismatch or CrashproofError, nothing executed). Returns
        the run's result; raises what ``resume`` raises."""
        run_id = claimed.run_id
        self._claimed[run_id] = claimed.lease
        try:
            row = self._store.get_run(run_id)
            workflow = None if row is None else self._workflows.get(row.workflow)
            if workflow is not None and workflow.is_async:  # on a loop of this thread's own
                if row is None or row.status.terminal:
                    return asyncio.run(self.resume_async(run_id))
                return asyncio.run(self._drive_async(workflow, run_id, options))
            if workflow is None or row is None or row.status.terminal:
                return self.resume(run_id)  # says why it cannot, or answers an ended run
            return self._drive(workflow, run_id, options)
        finally:
            unused = self._claimed.pop(run_id, None)
            if unused is not None:  # the drive never started (e.g. the run had ended)
                release(self._store, run_id, unused)

    async def drive_claimed_async(self, claimed: Claimed, options: RunOptions | None = None) -> Any:
        """``drive_claimed`` on the running event loop: an async workflow awaited, a sync one
        (or a run to refuse or answer) in a worker thread."""
        row = self._store.get_run(claimed.run_id)
        workflow = None if row is None else self._workflows.get(row.workflow)
        if workflow is None or row is None or row.status.terminal or not workflow.is_async:
            return await asyncio.to_thread(self.drive_claimed, claimed, options)
        self._claimed[claimed.run_id] = claimed.lease
        try:
            return await self._drive_async(workflow, claimed.run_id, options)
        finally:
            unused = self._claimed.pop(claimed.run_id, None)
            if unused is not None:  # the drive never started (e.g. the run had ended)
                release(self._store, claimed.run_id, unused)

    def _lease_for(self, run_id: str, take_over: bool, wait: float) -> Grant:
        """The lease a drive of ``run_id`` runs under: the queue claim's, when this Ledger's
        worker claimed the run just now, else a new claim."""
        held = self._claimed.pop(run_id, None)
        if held is not None:
            return adopt(run_id, held)
        return claim(self._store, run_id, self.worker_id, self.lease_seconds, take_over, wait)
