"""What the console's pages read of a journal, verified and folded once, and kept
between pages for runs no process drives (``Folds``); a run whose journal fails
verification is kept as its refusal (``RefusedRun``) instead, so one bad run is listed,
marked, beside the others and never turns a page into an error.

A first read of a 20,000-step run costs about 150 ms (read, verify, header), a later one
from ``Folds`` a few milliseconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from crashproof.errors import IntegrityError
from crashproof.journal import payloads
from crashproof.journal.fold import Replay, fold_run, index_journal, step_keys
from crashproof.journal.records import Event, EventType, RunInfo, RunRow, RunStatus
from crashproof.runtime.guards.approvals import awaiting, expectation
from crashproof.runtime.guards.review import ReviewCase, cases_of
from crashproof.runtime.operations.audit import timeline
from crashproof.runtime.port import DriveHost
from crashproof.store.index import IndexQuery, outbox_index, run_index

__all__ = ["DRIVEN", "Fold", "Folds", "PendingMessage", "RefusedRun", "pending_approval"]

# Runs that deliver their own outbox messages (a drive does on resume) or left the ledger.
DRIVEN = (RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.MOVED)
_DRIVEN_VALUES = frozenset(status.value for status in DRIVEN)


@dataclass(frozen=True, slots=True, kw_only=True)
class RefusedRun:
    """A run whose journal fails verification (an altered record, a rollback, a missing
    witness, a key this ledger lacks): listed with the refusal instead of its fold, so
    one bad run never hides the others. ``workflow``, ``version``, ``status`` and
    ``updated_at`` come from its index row, a cache the journal did not confirm."""

    run_id: str
    workflow: str
    version: str
    status: str
    updated_at: float
    error: str  # the refusal's class: JournalTampered, WitnessMissing, ...
    reason: str  # its message: what was found, and what to do


def refused(row: RunRow, exc: IntegrityError) -> RefusedRun:
    return RefusedRun(
        run_id=row.run_id,
        workflow=row.workflow,
        version=row.version,
        status=row.status.value,
        updated_at=row.updated_at,
        error=type(exc).__name__,
        reason=str(exc),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingMessage:
    """An outbox message journaled but not delivered yet."""

    run_id: str
    step: str
    tool: str | None
    message: Any
    failures: int  # delivery attempts that failed so far


def _marks(host: DriveHost) -> list[tuple[str, str, float]]:
    index = run_index(host.store)
    if index is not None:
        return index.index_marks()
    rows = [row for row in host.store.list_runs() if IndexQuery().matches(row)]
    return [(row.run_id, row.status.value, row.updated_at) for row in rows]


def pending_approval(run_id: str, events: list[Event]) -> dict[str, Any] | None:
    """What an approval would release when the run waits on one now, else None: the
    binding (``expectation``) and the pending act (tool, params) as the freeze recorded."""
    freeze = awaiting(events)
    if freeze is None:
        return None
    later = (EventType.RUN_THAWED, EventType.RUN_FAILED, EventType.RUN_SUCCEEDED)
    if any(e.seq > freeze.seq and e.type in later for e in events):
        return None
    evidence = payloads.run_frozen(freeze).get("evidence") or {}
    return {
        "run_id": run_id,
        "step": freeze.key,
        "binding": expectation(freeze),
        "pending_act": evidence.get("pending_act") or {},
        "refused_approvals": evidence.get("refused_approvals") or [],
    }


def _undelivered(run_id: str, events: list[Event], replay: Replay) -> list[PendingMessage]:
    pending = replay.undelivered
    failures: dict[str, int] = {}
    for event in events:
        if event.type is EventType.OUTBOX_FAILED and event.key is not None:
            failures[event.key] = failures.get(event.key, 0) + 1
    out: list[PendingMessage] = []
    for key, event in pending.items():
        outbox = payloads.step_done(event).get("outbox")
        out.append(
            PendingMessage(
                run_id=run_id,
                step=key,
                tool=None if outbox is None else outbox.get("tool"),
                message=None if outbox is None else outbox.get("message"),
                failures=failures.get(key, 0),
            )
        )
    return out


def _cases(events: list[Event]) -> tuple[ReviewCase, ...]:
    # A case is a needs_review freeze: a journal with no run_frozen has none, and this
    # type test skips cases_of's decoding of every record (20,000 steps: ~30 ms).
    if not any(event.type is EventType.RUN_FROZEN for event in events):
        return ()
    return tuple(cases_of(events))


@dataclass(frozen=True, slots=True)
class Fold:
    """A run's verified journal, folded, with what the pages read of it."""

    mark: tuple[str, float]  # the index row's (status, updated_at) when it was read
    info: RunInfo  # without its steps (``fold_run(steps=False)``): a page folds its own
    events: list[Event]  # empty unless kept whole (a run's own page)
    keys: tuple[str, ...]  # its steps' keys in order (``step_keys``), when kept whole
    replay: Replay | None  # its ``index_journal``, when kept whole
    cases: tuple[ReviewCase, ...]
    pending: dict[str, Any] | None  # the approval it waits on
    outbox: tuple[PendingMessage, ...]  # undelivered messages


class Folds:
    """Folds of runs no process drives, kept between pages.

    Why a kept fold stays true: a run that is ended or frozen changes its journal only
    (a) by being driven again (a resume, a retry, an approval or a decision that thaws
    it), which changes its index row's status and ``updated_at`` in the same transaction
    as its first record, or (b) by an outbox delivery (``dispatch_outbox``), which
    appends without a status change. So a fold is kept per (status, updated_at), runs
    with undelivered messages are folded again on every read (a delivery made by a
    worker or another console shows at once), and running or queued runs always are.
    Whole journals are kept for the ``keep`` runs read last (a run's page); the rest
    keep their fold only."""

    def __init__(self, keep: int = 4) -> None:
        self._folds: dict[str, Fold] = {}
        self._timelines: dict[str, tuple[Fold, list[dict[str, Any]]]] = {}
        self._whole: list[str] = []
        # Runs with no outbox message at all (``OutboxIndex``), by the mark they had then.
        self._clean: dict[str, tuple[str, float]] = {}
        # Runs whose journal failed verification when last read, by their index mark.
        self._refused: dict[str, tuple[tuple[str, float], RefusedRun]] = {}
        self._keep = keep
        self._lock = threading.Lock()

    def checked(self, host: DriveHost, row: RunRow, *, whole: bool = False) -> Fold | RefusedRun:
        """``get``, or the run's refusal when its journal fails verification: a page
        lists a bad run beside the others instead of failing whole. A refusal is read
        again on every call (an operator may have restored the file or re-anchored)."""
        try:
            fold = self.get(host, row, whole=whole)
        except IntegrityError as exc:
            refusal = refused(row, exc)
            with self._lock:
                self._refused[row.run_id] = ((row.status.value, row.updated_at), refusal)
            return refusal
        with self._lock:
            self._refused.pop(row.run_id, None)
        return fold

    def refusals(self) -> list[RefusedRun]:
        """The runs found failing verification by the reads so far, newest first."""
        with self._lock:
            found = [refusal for _, refusal in self._refused.values()]
        return sorted(found, key=lambda r: (-r.updated_at, r.run_id))

    def get(self, host: DriveHost, row: RunRow, *, whole: bool = False) -> Fold:
        mark = (row.status.value, row.updated_at)
        with self._lock:
            kept = self._folds.get(row.run_id)
        if kept is not None and kept.mark == mark and (kept.events or not whole):
            return kept
        events = host.journal(row.run_id)
        replay = index_journal(events)
        info = fold_run(row, events, steps=False, replay=replay)
        fold = Fold(
            mark=mark,
            info=info,
            events=events if whole else [],
            keys=tuple(step_keys(events)) if whole else (),
            replay=replay if whole else None,
            cases=_cases(events) if info.status.frozen or whole else (),
            pending=pending_approval(row.run_id, events)
            if info.status is RunStatus.AWAITING_APPROVAL
            else None,
            outbox=tuple(_undelivered(row.run_id, events, replay))
            if row.status not in DRIVEN
            else (),
        )
        if row.status not in DRIVEN and not fold.outbox:
            with self._lock:
                self._folds[row.run_id] = fold
                if whole:
                    self._whole = [r for r in self._whole if r != row.run_id] + [row.run_id]
                    for old in self._whole[: -self._keep]:
                        self._drop_events(old)
                    self._whole = self._whole[-self._keep :]
        return fold

    def timeline(self, run_id: str, fold: Fold) -> list[dict[str, Any]]:
        """The audit timeline of ``fold`` (whole), kept with it while it is kept."""
        with self._lock:
            kept = self._timelines.get(run_id)
        if kept is not None and kept[0] is fold:
            return kept[1]
        entries = timeline(fold.events)
        with self._lock:
            if self._folds.get(run_id) is fold:
                self._timelines[run_id] = (fold, entries)
        return entries

    def _drop_events(self, run_id: str) -> None:
        self._timelines.pop(run_id, None)
        kept = self._folds.get(run_id)
        if kept is not None:
            self._folds[run_id] = Fold(
                mark=kept.mark,
                info=kept.info,
                events=[],
                keys=(),
                replay=None,
                cases=kept.cases,
                pending=kept.pending,
                outbox=kept.outbox,
            )

    def pending(self, host: DriveHost) -> list[PendingMessage]:
        """The undelivered outbox messages of the runs no process drives: the index's
        marks, then the journals of the runs whose mark changed or that had some."""
        marks = _marks(host)
        with self._lock:  # one pass under one lock: 10,000 runs in a few ms
            folds, clean = self._folds, self._clean
            changed = [
                (run_id, (status, updated_at))
                for run_id, status, updated_at in marks
                if status not in _DRIVEN_VALUES
                and ((kept := folds.get(run_id)) is None or kept.mark != (status, updated_at))
                and clean.get(run_id) != (status, updated_at)
            ]  # a kept fold had no undelivered message, a clean run no message at all
        index = outbox_index(host.store) if changed else None
        if index is not None:
            # Marks first, then the scan: a message journaled since comes with a status
            # change (its drive ended), so a new mark, and the run is read next time.
            with_outbox = index.index_outbox_runs()
            with self._lock:
                for run_id, mark in changed:
                    if run_id not in with_outbox:
                        self._clean[run_id] = mark
            changed = [(run_id, mark) for run_id, mark in changed if run_id in with_outbox]
        found: list[PendingMessage] = []
        for run_id, _ in changed:
            row = host.store.get_run(run_id)
            if row is not None and row.status not in DRIVEN:
                fold = self.checked(host, row)
                if not isinstance(fold, RefusedRun):
                    found.extend(fold.outbox)
        return found

    def sweep(self, host: DriveHost) -> None:
        """Verify every run once (kept folds are not read again; a refusal is), so that
        ``refusals`` names every run whose journal fails verification, not only those a
        page happened to show."""
        for row in host.store.list_runs():
            if IndexQuery().matches(row):
                self.checked(host, row)
