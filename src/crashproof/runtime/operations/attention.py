"""What waits for a human, for the console's Needs attention page and every page's
counts: frozen or stopped runs, open review cases, pending approvals, undelivered outbox
messages, drifted acts, and runs whose journal fails verification.

The counts read the index, plus the journals of frozen runs and of the runs the index
names as holding an outbox message (``index_outbox_runs``); the detailed page verifies
every run once (``Folds.sweep``; kept folds are not read again).
"""

from __future__ import annotations

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

__all__ = ["ATTENTION_STATUSES", "Attention", "PendingApproval", "attention"]

# Runs that wait for a human or an operator (DESIGN §3): frozen, or stopped resumable.
ATTENTION_STATUSES = (RunStatus.NEEDS_REVIEW, RunStatus.AWAITING_APPROVAL, RunStatus.STOPPED)


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
    )
