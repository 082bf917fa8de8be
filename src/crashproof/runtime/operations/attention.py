"""What waits for a human, for the console's Needs attention page and every page's
counts: frozen or stopped runs, open review cases, pending approvals, undelivered outbox
messages, drifted acts, and runs whose journal fails verification.

The counts read the index, plus the journals of frozen runs and of the runs the index
names as holding an outbox message (``index_outbox_runs``); the detailed page verifies
every run once (``Folds.sweep``; kept folds are not read again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from crashproof.errors import IntegrityError
from crashproof.journal.fold import fold_run
from crashproof.journal.records import RunInfo, RunStatus
from crashproof.runtime.guards.review import ReviewCase, cases_of
from crashproof.runtime.operations.browse import index_rows, index_summary
from crashproof.runtime.operations.folds import Folds, PendingMessage, RefusedRun, pending_approval
from crashproof.runtime.port import DriveHost
from crashproof.store.index import IndexQuery, outbox_index
from crashproof.store.queue import QueueStore

__all__ = ["ATTENTION_STATUSES", "Abandoned", "Attention", "PendingApproval", "attention"]

# Runs that wait for a human or an operator (DESIGN §3): frozen, stopped resumable, or
# failed (a retry under the same run id, or nothing: someone decides).
ATTENTION_STATUSES = (
    RunStatus.NEEDS_REVIEW,
    RunStatus.AWAITING_APPROVAL,
    RunStatus.STOPPED,
    RunStatus.FAILED,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Abandoned:
    """A run not ended that nobody drives: its owner's lease expired (the process died
    or stalled; any worker or ``resume`` takes it over), or nobody owns it."""

    run_id: str
    workflow: str
    version: str
    owner: str | None
    expired_at: float | None  # the lease's expiry, by the store's clock
    updated_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingApproval:
    run_id: str
    step: str | None
    binding: dict[str, Any]
    pending_act: dict[str, Any]
    refused_approvals: list[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Attention:
    """What waits for a human: the counts (for every page's header) and, with
    ``detail``, up to ``limit`` of each kind."""

    counts: dict[str, int]
    frozen: tuple[RunInfo, ...] = ()
    cases: tuple[ReviewCase, ...] = ()
    approvals: tuple[PendingApproval, ...] = ()
    outbox: tuple[PendingMessage, ...] = ()
    drifted: tuple[RunInfo, ...] = ()  # runs whose latest reconciliation found drift
    refused: tuple[RefusedRun, ...] = ()  # runs whose journal fails verification
    abandoned: tuple[Abandoned, ...] = ()  # runs not ended that nobody drives


def _abandoned(host: DriveHost, limit: int) -> list[Abandoned]:
    """Running or queued runs whose lease expired or that nobody holds, oldest update
    first (they have waited longest). A queued run nobody holds yet waits for a worker
    as it should: listed only once it is older than a lease."""
    if not isinstance(host.store, QueueStore):
        return []
    leases = host.store.leases()
    now = time.time()
    found: list[Abandoned] = []
    for status in (RunStatus.RUNNING, RunStatus.QUEUED):
        rows, _ = index_rows(host, IndexQuery(status), 0, 10 * limit)
        for row in rows:
            lease = leases.get(row.run_id)
            owner = None if lease is None else lease.owner
            expires = None if lease is None or owner is None else lease.expires_at
            if owner is not None and expires is not None and expires > now:
                continue  # driven now
            if status is RunStatus.QUEUED and owner is None and now - row.updated_at < _LEASE:
                continue  # just queued
            found.append(
                Abandoned(
                    run_id=row.run_id,
                    workflow=row.workflow,
                    version=row.version,
                    owner=owner,
                    expired_at=expires,
                    updated_at=row.updated_at,
                )
            )
    return sorted(found, key=lambda a: (a.updated_at, a.run_id))[:limit]


_LEASE = 30.0  # seconds a queued run may wait for its first worker before it is listed


def _drifted(host: DriveHost, limit: int) -> list[RunInfo]:
    """The runs with an act whose latest journaled finding is ``drifted``: only those the
    index names as reconciled are read (verified and folded)."""
    index = outbox_index(host.store)
    if index is None:
        return []
    found = []
    for run_id in sorted(index.index_reconciled_runs()):
        row = host.store.get_run(run_id)
        if row is None:
            continue
        try:
            info = fold_run(row, host.journal(run_id, results=False), steps=False)
        except IntegrityError:
            continue  # listed with the refusals (``attention``), never this page's error
        if info.drifted:
            found.append(info)
    return found[:limit]


def attention(host: DriveHost, folds: Folds, *, detail: bool = False, limit: int = 50) -> Attention:
    """The counts of frozen or stopped runs, open review cases, pending approvals and
    undelivered outbox messages; with ``detail``, the first ``limit`` of each."""
    by_status = index_summary(host)[0]
    counts = {status.value: by_status.get(status.value, 0) for status in ATTENTION_STATUSES}
    messages = folds.pending(host)
    counts["outbox"] = len(messages)
    drifted = _drifted(host, limit)
    counts["drifted"] = len(drifted)
    if detail:
        folds.sweep(host)
    bad = folds.refusals()
    counts["refused"] = len(bad)
    abandoned = _abandoned(host, limit)
    counts["abandoned"] = len(abandoned)
    if not detail:
        return Attention(counts=counts)
    frozen: list[RunInfo] = []
    cases: list[ReviewCase] = []
    approvals: list[PendingApproval] = []
    frozen_rows = [
        row
        for status in ATTENTION_STATUSES
        for row in index_rows(host, IndexQuery(status), 0, limit)[0]
    ]
    for row in sorted(frozen_rows, key=lambda r: -r.updated_at)[:limit]:
        try:
            events = host.journal(row.run_id)
        except IntegrityError:
            continue  # in ``refused`` (the sweep found it)
        frozen.append(fold_run(row, events))
        cases.extend(case for case in cases_of(events) if case.state == "open")
        pending = (
            pending_approval(row.run_id, events)
            if row.status is RunStatus.AWAITING_APPROVAL
            else None
        )
        if pending is not None:
            approvals.append(PendingApproval(**pending))
    return Attention(
        counts=counts,
        frozen=tuple(frozen),
        cases=tuple(cases),
        approvals=tuple(approvals),
        outbox=tuple(messages[:limit]),
        drifted=tuple(drifted),
        refused=tuple(bad[:limit]),
        abandoned=tuple(abandoned),
    )
