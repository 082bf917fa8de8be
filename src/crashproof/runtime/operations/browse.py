"""Paged read models for an operator's console (``crashproof ui``): a page of runs, a
page of one run's steps with each act's evidence, and what needs a human.

Read-only, and never the whole ledger at once: a page of runs reads the run index (one
row per run, no journal) and folds only the journals of the runs on that page, without
their steps; a run's page verifies that one journal whole (the HMAC chain runs from the
first record) and folds only the page of steps it shows (``fold_steps``). The attention
counts read the index, plus the journals of frozen runs and of the runs the index names
as holding an outbox message (``index_outbox_runs``).

``Folds`` keeps what a journal said between pages, for runs no process drives, until
the run's index row changes (see its docstring for why that is enough); a first page of
a 20,000-step run costs about 150 ms (read, verify, header), a later one from ``Folds``
a few milliseconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from crashproof.errors import RunNotFound
from crashproof.journal import payloads
from crashproof.journal.fold import Replay, fold_run, fold_steps, index_journal, step_keys
from crashproof.journal.records import Event, EventType, RunInfo, RunRow, RunStatus, StepInfo
from crashproof.runtime.guards.approvals import awaiting, expectation
from crashproof.runtime.guards.review import ReviewCase, cases_of
from crashproof.runtime.operations.audit import timeline
from crashproof.runtime.port import DriveHost
from crashproof.store.index import IndexQuery, outbox_index, run_index

__all__ = [
    "ATTENTION_STATUSES",
    "ActEvidence",
    "Attention",
    "Folds",
    "PendingApproval",
    "PendingMessage",
    "RunsPage",
    "StepsPage",
    "attention",
    "runs_page",
    "steps_page",
    "timeline_page",
]

# Runs that wait for a human or an operator (DESIGN §3): frozen, or stopped resumable.
ATTENTION_STATUSES = (RunStatus.NEEDS_REVIEW, RunStatus.AWAITING_APPROVAL, RunStatus.STOPPED)
# Runs that deliver their own outbox messages (a drive does on resume) or left the ledger.
_DRIVEN = (RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.MOVED)
_DRIVEN_VALUES = frozenset(status.value for status in _DRIVEN)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsPage:
    """One page of runs, newest update first, and how many matched in all."""

    runs: tuple[RunInfo, ...]
    total: int
    offset: int
    limit: int
    workflows: tuple[str, ...]  # every workflow name in the index, for a filter


def _index_page(
    host: DriveHost, query: IndexQuery, offset: int, limit: int
) -> tuple[list[RunRow], int]:
    """A page of index rows from the store's index, else from every row (a store
    without ``crashproof.store.index``)."""
    index = run_index(host.store)
    if index is not None:
        return index.index_page(query, offset, limit)
    rows = [row for row in host.store.list_runs() if query.matches(row)]
    rows.sort(key=lambda row: row.run_id)
    rows.sort(key=lambda row: row.updated_at, reverse=True)
    return rows[offset : offset + limit], len(rows)


def _summary(host: DriveHost) -> tuple[dict[str, int], list[str]]:
    index = run_index(host.store)
    if index is not None:
        return index.index_summary()
    rows = [row for row in host.store.list_runs() if IndexQuery().matches(row)]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status.value] = counts.get(row.status.value, 0) + 1
    return counts, sorted({row.workflow for row in rows})


def _marks(host: DriveHost) -> list[tuple[str, str, float]]:
    index = run_index(host.store)
    if index is not None:
        return index.index_marks()
    rows = [row for row in host.store.list_runs() if IndexQuery().matches(row)]
    return [(row.run_id, row.status.value, row.updated_at) for row in rows]


def runs_page(
    host: DriveHost,
    folds: Folds,
    *,
    status: RunStatus | None = None,
    workflow: str | None = None,
    search: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> RunsPage:
    """Runs filtered by ``status`` and ``workflow`` (exact) and ``search`` (a substring of
    the run id), newest update first, ``limit`` of them from ``offset``.

    The filters read the index row (a cache every status change writes in its own
    transaction); each run shown is folded from its verified journal, and one whose
    journal says another status than the filter is left off the page."""
    offset = max(0, offset)
    rows, total = _index_page(host, IndexQuery(status, workflow, search), offset, limit)
    infos = [folds.get(host, row).info for row in rows]
    shown = tuple(info for info in infos if status is None or info.status is status)
    return RunsPage(
        runs=shown, total=total, offset=offset, limit=limit, workflows=tuple(_summary(host)[1])
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ActEvidence:
    """What the journal holds about one act beyond its ``StepInfo``: the tool, each
    attempt's intent with the fencing token of the drive that wrote it, every unknown
    outcome, the receipt (``reconciled``: found by a lookup), and outbox deliveries."""

    tool: str | None = None
    tool_version: str | None = None
    attempts: tuple[dict[str, Any], ...] = ()  # attempt, fencing_token, started_at
    unknown: tuple[dict[str, Any], ...] = ()  # attempt, error, started_at, ended_at
    receipt: dict[str, Any] | None = None
    deliveries: tuple[dict[str, Any], ...] = ()  # outbox: delivered / failed, when


@dataclass(frozen=True, slots=True, kw_only=True)
class StepsPage:
    """One run and one page of its steps (journal order), each act with its evidence."""

    info: RunInfo
    steps: tuple[StepInfo, ...]
    acts: dict[str, ActEvidence]
    total: int
    offset: int
    limit: int
    review_cases: tuple[ReviewCase, ...] = ()
    pending_approval: dict[str, Any] | None = None


def _acts(events: list[Event], keys: set[str]) -> dict[str, ActEvidence]:
    """The evidence of the acts among ``keys``, read in one pass over the journal."""
    token: int | None = None
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.mentions("session"):  # a text test: most records are never decoded here
            session = payloads.drive_record(event).get("session")
            if isinstance(session, dict):
                token = session.get("fencing_token")
        if event.key is None or event.key not in keys:
            continue
        entry = found.setdefault(
            event.key, {"attempts": [], "unknown": [], "receipt": None, "deliveries": []}
        )
        if event.type is EventType.ACT_INTENT:
            intent = payloads.act_intent(event)
            entry["tool"], entry["tool_version"] = intent.get("tool"), intent.get("tool_version")
            entry["attempts"].append(
                {
                    "attempt": intent.get("attempt"),
                    "fencing_token": token,
                    "started_at": intent.get("started_at"),
                }
            )
        elif event.type is EventType.ACT_UNKNOWN:
            unknown = payloads.act_unknown(event)
            entry["unknown"].append({k: unknown.get(k) for k in _UNKNOWN_FIELDS})
        elif event.type is EventType.STEP_DONE:
            done = payloads.step_done(event)
            entry["receipt"] = done.get("receipt")
            outbox = done.get("outbox")
            if outbox is not None:
                entry.setdefault("tool", outbox.get("tool"))
        elif event.type in (EventType.OUTBOX_DELIVERED, EventType.OUTBOX_FAILED):
            entry["deliveries"].append(
                {"type": event.type.value, "at": event.created_at, **_delivery(event)}
            )
    return {
        key: ActEvidence(
            tool=e.get("tool"),
            tool_version=e.get("tool_version"),
            attempts=tuple(e["attempts"]),
            unknown=tuple(e["unknown"]),
            receipt=e["receipt"],
            deliveries=tuple(e["deliveries"]),
        )
        for key, e in found.items()
    }


_UNKNOWN_FIELDS = ("attempt", "error", "started_at", "ended_at")


def _delivery(event: Event) -> dict[str, Any]:
    if event.type is EventType.OUTBOX_DELIVERED:
        return {"receipt_id": payloads.outbox_delivered(event).get("receipt_id")}
    return {"error": payloads.any_record(event).get("error")}


def _pending(run_id: str, events: list[Event]) -> dict[str, Any] | None:
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


def steps_page(
    host: DriveHost, folds: Folds, run_id: str, *, offset: int = 0, limit: int = 100
) -> StepsPage:
    """The run ``run_id`` (``RunNotFound`` when there is none) and ``limit`` of its steps
    from ``offset``, with the acts' evidence, its review cases and a pending approval."""
    row = host.store.get_run(run_id)
    if row is None:
        raise RunNotFound(f"no run {run_id!r} in {host.shown_url}")
    fold = folds.get(host, row, whole=True)
    info, events = fold.info, fold.events
    offset = max(0, offset)
    wanted = fold.keys[offset : offset + limit]  # only this page's steps are folded
    replay = fold.replay if fold.replay is not None else index_journal(events)
    steps = fold_steps(events, replay, frozenset(wanted))
    acts = _acts(events, {s.key for s in steps if s.kind.value == "act"})
    return StepsPage(
        info=info,
        steps=steps,
        acts=acts,
        total=len(fold.keys),
        offset=offset,
        limit=limit,
        review_cases=fold.cases,
        pending_approval=fold.pending,
    )


def timeline_page(
    host: DriveHost, folds: Folds, run_id: str, *, offset: int = 0, limit: int = 200
) -> tuple[RunInfo, list[dict[str, Any]], int]:
    """The run, ``limit`` entries of its audit timeline from ``offset`` (every journal
    record: when, what, who wrote it, with which versions; ``audit.timeline``), and how
    many records it has."""
    row = host.store.get_run(run_id)
    if row is None:
        raise RunNotFound(f"no run {run_id!r} in {host.shown_url}")
    fold = folds.get(host, row, whole=True)
    entries = folds.timeline(row.run_id, fold)
    offset = max(0, offset)
    return fold.info, entries[offset : offset + limit], len(entries)


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingMessage:
    """An outbox message journaled but not delivered yet."""

    run_id: str
    step: str
    tool: str | None
    message: Any
    failures: int  # delivery attempts that failed so far


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


def _drifted(host: DriveHost, limit: int) -> list[RunInfo]:
    """The runs with an act whose latest journaled finding is ``drifted``: only those the
    index names as reconciled are read (verified and folded)."""
    index = outbox_index(host.store)
    if index is None:
        return []
    found = []
    for run_id in sorted(index.index_reconciled_runs()):
        row = host.store.get_run(run_id)
        if row is not None:
            info = fold_run(row, host.journal(run_id, results=False), steps=False)
            if info.drifted:
                found.append(info)
    return found[:limit]


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
        self._keep = keep
        self._lock = threading.Lock()

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
            pending=_pending(row.run_id, events)
            if info.status is RunStatus.AWAITING_APPROVAL
            else None,
            outbox=tuple(_undelivered(row.run_id, events, replay))
            if row.status not in _DRIVEN
            else (),
        )
        if row.status not in _DRIVEN and not fold.outbox:
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
            if row is not None and row.status not in _DRIVEN:
                found.extend(self.get(host, row).outbox)
        return found


def attention(host: DriveHost, folds: Folds, *, detail: bool = False, limit: int = 50) -> Attention:
    """The counts of frozen or stopped runs, open review cases, pending approvals and
    undelivered outbox messages; with ``detail``, the first ``limit`` of each."""
    by_status = _summary(host)[0]
    counts = {status.value: by_status.get(status.value, 0) for status in ATTENTION_STATUSES}
    messages = folds.pending(host)
    counts["outbox"] = len(messages)
    drifted = _drifted(host, limit)
    counts["drifted"] = len(drifted)
    if not detail:
        return Attention(counts=counts)
    frozen: list[RunInfo] = []
    cases: list[ReviewCase] = []
    approvals: list[PendingApproval] = []
    frozen_rows = [
        row
        for status in ATTENTION_STATUSES
        for row in _index_page(host, IndexQuery(status), 0, limit)[0]
    ]
    for row in sorted(frozen_rows, key=lambda r: -r.updated_at)[:limit]:
        events = host.journal(row.run_id)
        frozen.append(fold_run(row, events))
        cases.extend(case for case in cases_of(events) if case.state == "open")
        pending = (
            _pending(row.run_id, events) if row.status is RunStatus.AWAITING_APPROVAL else None
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
    )
