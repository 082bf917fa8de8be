"""Reconciliation that is journaled and repeats: each act's finding recorded in its run,
and a worker's periodic pass over the runs nobody drives.

``Ledger.reconcile(run, tools, record=True, by=NAME)`` (CLI: ``crashproof reconcile RUN
--app M --record --by NAME``) looks every recorded act up, as the read-only
``reconcile`` does (``runtime/steps/reconcile.py``), then appends one ``act_reconciled``
record per act: the finding (``confirmed`` / ``drifted`` / ``needs_review``), its detail,
what the lookup answered (receipt id, intent digest, the result's digest) and when, and who
asked (the operator, or the worker's id). All of them in one commit, under the run's
lease, with no status change: an ended run stays ended, a frozen one frozen; a drifted act
freezes nothing. The latest finding per act is what ``show`` and ``runs --drifted`` read
(``journal/fold.py`` ``reconciled_findings``), so a later pass that finds the resource
restored clears the drift.

A run another process drives right now is not reconciled in its place: its lease is held,
``LeaseHeld`` is raised (the CLI's exit code for a held run), nothing written; its own
resume re-reads its receipts before its first live call anyway.

``ReconcilePass``: ``crashproof worker --reconcile-every 10m`` reconciles the ended and
frozen runs, oldest first, at most ``limit`` acts per pass (the bound on the lookups one
pass sends to the targets), resuming after the last run it reached on the next pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from crashproof.errors import CrashproofError, LeaseHeld
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.driving.leases import operator_lease
from crashproof.runtime.guards.approvers import reserved
from crashproof.runtime.guards.budget import operator
from crashproof.runtime.port import DriveHost
from crashproof.runtime.steps.reconcile import ACT_TEXT, ActCheck
from crashproof.tools.port import Tool

__all__ = ["ReconcilePass", "record_findings"]

log = logging.getLogger(__name__)

_PASSED = (RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.MOVED)  # driven, or elsewhere


class _Host(DriveHost, Protocol):
    worker_id: str
    lease_seconds: float


def record_findings(host: _Host, run_id: str, checks: Sequence[ActCheck], by: str | None) -> int:
    """Journal ``checks`` (one run's) as ``act_reconciled`` records under the run's lease;
    returns how many. Raises ``LeaseHeld`` when another process drives the run."""
    if not checks:
        return 0
    who = operator(by)
    with operator_lease(host.store, run_id, host.worker_id, host.lease_seconds) as lease:
        events = host.journal(run_id, owner=True)
        now = time.time()
        records = tuple(
            Event(
                run_id=run_id,
                seq=len(events) + n,
                type=EventType.ACT_RECONCILED,
                key=check.step,
                payload={
                    **who,
                    "time": now,
                    "finding": check.status,
                    "detail": check.detail,
                    "operation_id": check.operation_id,
                    "tool": check.tool,
                    "receipt": check.receipt,
                    "checked_at": check.checked_at,
                },
                created_at=now,
            )
            for n, check in enumerate(checks)
        )
        host.append_records(records, None, fencing_token=lease.token, output=True)
    return len(records)


class _Reconciler(_Host, Protocol):
    def reconcile(self, run_id: str, tools: Sequence[Tool]) -> list[ActCheck]: ...


class ReconcilePass:
    """Reconciles ended and frozen runs when due, at most ``limit`` acts a pass (a run is
    never split: one with more acts than the limit is reconciled alone in its pass); free
    (one clock read) when not due, or without tools."""

    def __init__(
        self, ledger: _Reconciler, tools: Sequence[Tool], every: float | None, by: str, limit: int
    ) -> None:
        if every is not None and not every > 0:
            raise ValueError(f"the reconcile interval must be > 0 seconds, not {every!r}")
        if limit < 1:
            raise ValueError(f"the reconcile limit must be >= 1 act per pass, not {limit!r}")
        self._ledger = ledger
        self.tools = tuple(tools)
        self.every = every
        self.by = by
        self.limit = limit
        self._due = 0.0  # the first pass runs at once
        self._after: str | None = None  # the last run the previous pass reached

    def tick(self) -> dict[str, int]:
        """A pass if one is due: counts of findings by kind (empty when none ran)."""
        if self.every is None or not self.tools or time.monotonic() < self._due:
            return {}
        self._due = time.monotonic() + self.every
        ledger = self._ledger
        rows = [r for r in ledger.store.list_runs() if r.status not in _PASSED]
        rows.sort(key=lambda r: (r.created_at, r.run_id))
        ids = [r.run_id for r in rows if not reserved(r.run_id)]
        if self._after in ids:  # go on after the last run reached, then wrap around
            cut = ids.index(self._after) + 1
            ids = ids[cut:] + ids[:cut]
        found: dict[str, int] = {}
        left = self.limit
        for run_id in ids:
            try:
                journal = ledger.journal(run_id, results=False)
                acts = sum(
                    1
                    for e in journal
                    if e.type is EventType.STEP_DONE and (e.payload_json or "").startswith(ACT_TEXT)
                )
                if not acts:
                    continue
                if acts > left and left < self.limit:
                    break  # the next pass starts with this run
                checks = ledger.reconcile(run_id, self.tools)
                left -= acts
                self._after = run_id
                record_findings(ledger, run_id, checks, self.by)
            except LeaseHeld:
                continue  # being driven (resumed, dispatched): its own drive re-reads
            except CrashproofError as exc:  # the next pass tries again; the worker goes on
                log.warning("reconcile pass: run %r: %s", run_id, exc)
                continue
            for check in checks:
                found[check.status] = found.get(check.status, 0) + 1
            if left <= 0:
                break
        return found
