"""Paged read models for an operator's console (``crashproof ui``) and ``crashproof
runs``: a page of runs, and a page of one run's steps with each act's evidence.

Read-only, and never the whole ledger at once: a page of runs reads the run index (one
row per run, no journal) and folds only the journals of the runs on that page, without
their steps; a run's page verifies that one journal whole (the HMAC chain runs from the
first record) and folds only the page of steps it shows (``fold_steps``). What a
journal said is kept between pages by ``folds.Folds``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from crashproof.errors import RunNotFound
from crashproof.journal import payloads
from crashproof.journal.fold import fold_steps, index_journal
from crashproof.journal.records import Event, EventType, RunInfo, RunRow, RunStatus, StepInfo
from crashproof.runtime.guards.review import ReviewCase
from crashproof.runtime.operations.bars import Bars, bars
from crashproof.runtime.operations.contents import StepContent, step_contents
from crashproof.runtime.operations.folds import Folds, RefusedRun
from crashproof.runtime.operations.redaction import Redaction
from crashproof.runtime.port import DriveHost
from crashproof.store.index import IndexQuery, run_index

__all__ = [
    "ActEvidence",
    "RunsPage",
    "StepsPage",
    "index_rows",
    "index_summary",
    "parse_when",
    "run_list",
    "runs_page",
    "step_page",
    "steps_page",
    "timeline_page",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsPage:
    """One page of runs, newest update first, and how many matched in all; the runs of
    the page whose journal fails verification are in ``refused``, not in ``runs``."""

    runs: tuple[RunInfo, ...]
    total: int
    offset: int
    limit: int
    workflows: tuple[str, ...]  # every workflow name in the index, for a filter
    refused: tuple[RefusedRun, ...] = ()
    undelivered: dict[str, int] = field(default_factory=dict)  # outbox messages, per run


def index_rows(
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


def index_summary(host: DriveHost) -> tuple[dict[str, int], list[str]]:
    index = run_index(host.store)
    if index is not None:
        return index.index_summary()
    rows = [row for row in host.store.list_runs() if IndexQuery().matches(row)]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status.value] = counts.get(row.status.value, 0) + 1
    return counts, sorted({row.workflow for row in rows})


def runs_page(
    host: DriveHost,
    folds: Folds,
    *,
    status: RunStatus | None = None,
    workflow: str | None = None,
    search: str | None = None,
    since: float | None = None,
    until: float | None = None,
    offset: int = 0,
    limit: int = 50,
) -> RunsPage:
    """Runs filtered by ``status`` and ``workflow`` (exact) and ``search`` (a substring of
    the run id), newest update first, ``limit`` of them from ``offset``.

    The filters read the index row (a cache every status change writes in its own
    transaction); each run shown is folded from its verified journal, and one whose
    journal says another status than the filter is left off the page."""
    offset = max(0, offset)
    query = IndexQuery(status, workflow, search, since, until)
    rows, total = index_rows(host, query, offset, limit)
    infos: list[RunInfo] = []
    bad: list[RefusedRun] = []
    undelivered: dict[str, int] = {}
    _fold_rows(host, folds, rows, status, infos, bad, undelivered)
    return RunsPage(
        runs=tuple(infos),
        total=total,
        offset=offset,
        limit=limit,
        workflows=tuple(index_summary(host)[1]),
        refused=tuple(bad),
        undelivered=undelivered,
    )


def _fold_rows(
    host: DriveHost,
    folds: Folds,
    rows: Iterable[RunRow],
    status: RunStatus | None,
    infos: list[RunInfo],
    bad: list[RefusedRun],
    undelivered: dict[str, int],
    limit: int | None = None,
) -> None:
    """Each of ``rows`` folded from its verified journal into ``infos`` (unless its
    journal says another status than ``status``), or its refusal into ``bad``, until
    ``limit`` runs are listed; its undelivered outbox messages counted."""
    for row in rows:
        if limit is not None and len(infos) + len(bad) >= limit:
            return
        fold = folds.checked(host, row)
        if isinstance(fold, RefusedRun):
            bad.append(fold)
        elif status is None or fold.info.status is status:
            infos.append(fold.info)
            if fold.outbox:
                undelivered[row.run_id] = len(fold.outbox)


_BATCH = 200  # index rows read at a time by ``run_list``
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, now: float | None = None) -> float:
    """A time a person types, as epoch seconds: an age (``90s``, ``30m``, ``2h``, ``7d``,
    ``1w``: that long ago) or an ISO 8601 date or time (``2026-12-05``,
    ``2026-12-05T10:00``; UTC unless it names a zone). ``ValueError`` says what is
    accepted."""
    text = text.strip()
    ago = _AGO.match(text)
    if ago:
        return (time.time() if now is None else now) - float(ago.group(1)) * _UNIT[ago.group(2)]
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an age (30m, 2h, 7d) nor an ISO date or time "
            "(2026-12-05, 2026-12-05T10:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def run_list(
    host: DriveHost,
    folds: Folds,
    *,
    status: RunStatus | None = None,
    workflow: str | None = None,
    since: float | None = None,
    limit: int | None = None,
) -> RunsPage:
    """``crashproof runs``: runs filtered by ``status`` and ``workflow``, newest update
    first, only those updated at or after ``since`` (epoch seconds), at most ``limit``
    (None: all). Like ``runs_page``, each run is folded from its verified journal, and one
    that fails verification is in ``refused``; ``total`` counts the index rows matching
    (before ``limit``)."""
    query = IndexQuery(status, workflow, since=since)
    infos: list[RunInfo] = []
    bad: list[RefusedRun] = []
    undelivered: dict[str, int] = {}
    offset = total = 0
    while limit is None or len(infos) + len(bad) < limit:
        rows, total = index_rows(host, query, offset, _BATCH)
        _fold_rows(host, folds, rows, status, infos, bad, undelivered, limit)
        if len(rows) < _BATCH:
            break
        offset += _BATCH
    return RunsPage(
        runs=tuple(infos),
        total=total,
        offset=0,
        limit=len(infos) + len(bad) if limit is None else limit,
        workflows=(),
        refused=tuple(bad),
        undelivered=undelivered,
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
    contents: dict[str, StepContent] = field(default_factory=dict)  # what each step holds
    bars: Bars | None = None  # the page's steps and the run's drives over time


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


def steps_page(
    host: DriveHost, folds: Folds, run_id: str, *, offset: int = 0, limit: int = 100
) -> StepsPage | RefusedRun:
    """The run ``run_id`` (``RunNotFound`` when there is none) and ``limit`` of its steps
    from ``offset``, with the acts' evidence, its review cases and a pending approval;
    or its refusal, when its journal fails verification."""
    row = host.store.get_run(run_id)
    if row is None:
        raise RunNotFound(f"no run {run_id!r} in {host.shown_url}")
    fold = folds.checked(host, row, whole=True)
    if isinstance(fold, RefusedRun):
        return fold
    info, events = fold.info, fold.events
    offset = max(0, offset)
    wanted = fold.keys[offset : offset + limit]  # only this page's steps are folded
    replay = fold.replay if fold.replay is not None else index_journal(events)
    steps = fold_steps(events, replay, frozenset(wanted))
    hide = Redaction.of(events)  # what the run's policy marks secret is never shown
    acts = {
        key: dataclasses.replace(act, receipt=hide.held(act.receipt, key))
        for key, act in _acts(events, {s.key for s in steps if s.kind.value == "act"}).items()
    }
    contents = step_contents(events, wanted, lambda: host.store.load_requests(run_id))
    drawn = bars(events, folds.timeline(row.run_id, fold), set(wanted))
    return StepsPage(
        info=hide.info(info),
        steps=tuple(
            s if s.error is None else dataclasses.replace(s, error=hide.value(s.error))
            for s in steps
        ),
        acts=acts,
        total=len(fold.keys),
        offset=offset,
        limit=limit,
        review_cases=tuple(hide.case(case) for case in fold.cases),
        pending_approval=hide.value(fold.pending),
        contents=contents,
        bars=drawn,
    )


def step_page(
    host: DriveHost, folds: Folds, run_id: str, key: str
) -> StepContent | RefusedRun | None:
    """What step ``key`` of run ``run_id`` holds, whole (None: no such recorded step;
    ``RunNotFound``; the run's refusal when its journal fails verification)."""
    row = host.store.get_run(run_id)
    if row is None:
        raise RunNotFound(f"no run {run_id!r} in {host.shown_url}")
    fold = folds.checked(host, row, whole=True)
    if isinstance(fold, RefusedRun):
        return fold
    return step_contents(fold.events, [key], lambda: host.store.load_requests(run_id)).get(key)


def timeline_page(
    host: DriveHost, folds: Folds, run_id: str, *, offset: int = 0, limit: int = 200
) -> tuple[RunInfo, list[dict[str, Any]], int] | RefusedRun:
    """The run, ``limit`` entries of its audit timeline from ``offset`` (every journal
    record: when, what, who wrote it, with which versions; ``audit.timeline``), and how
    many records it has; or its refusal, when its journal fails verification."""
    row = host.store.get_run(run_id)
    if row is None:
        raise RunNotFound(f"no run {run_id!r} in {host.shown_url}")
    fold = folds.checked(host, row, whole=True)
    if isinstance(fold, RefusedRun):
        return fold
    entries = folds.timeline(row.run_id, fold)
    offset = max(0, offset)
    return fold.info, entries[offset : offset + limit], len(entries)
