"""A run's two ends as a drive meets them: its start record, and the answer of a run
that has already ended (its result again, or the error it ended with)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from crashproof.errors import (
    ApprovalRequired,
    CrashproofError,
    NonDeterminismError,
    RunConflict,
    RunFailed,
    RunFrozen,
    RunStopped,
    Unverified,
)
from crashproof.integrity.witness import Witness, lost
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest, encode, error_from_record
from crashproof.journal.fold import Replay
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.runtime.driving import leases
from crashproof.runtime.port import DriveHost
from crashproof.runtime.workflow import Workflow
from crashproof.store.port import Lease, Store

T = TypeVar("T")

__all__ = [
    "StartRecord",
    "Started",
    "record_start",
    "record_starts",
    "recorded_outcome",
    "start_record",
    "stopped_error",
]

# A run this call created: its start record, and the lease it was created under.
Started = tuple[Event, Lease | None]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StartRecord:
    """A run's start as it will be written (``start_record``: made before any I/O, so
    that bad input is refused at once): its index row and its first record."""

    workflow: str
    row: RunRow
    first: Event


def start_record(
    workflow: Workflow[Any], run_id: str, input: dict[str, Any], fields: dict[str, Any]
) -> StartRecord:
    """The start of run ``run_id`` (``fields``: its limits and policy, and who starts it);
    TypeError or a clear error for input the workflow cannot take or JSON cannot hold."""
    workflow.bind_input(input)
    input_json = encode(input, what=f"the input of run {run_id!r}")
    digest = canonical_digest(
        {"workflow": workflow.name, "input": input}, what=f"the input of run {run_id!r}"
    )
    now = time.time()
    row = RunRow(
        run_id=run_id,
        workflow=workflow.name,
        version=workflow.version,
        status=RunStatus.RUNNING,
        input_digest=digest,
        created_at=now,
        updated_at=now,
    )
    first = Event(
        run_id=run_id,
        seq=0,
        type=EventType.RUN_STARTED,
        key=None,
        payload={
            "workflow": workflow.name,
            "version": workflow.version,
            "input_digest": digest,
            **fields,
        },
        value_json=input_json,
        created_at=now,
    )
    return StartRecord(workflow.name, row, first)


def record_start(host: DriveHost, start: StartRecord, owner: str | None = None) -> Started | None:
    """Record the run's start unless it exists with the same input; another input raises
    RunConflict. Returns the start record when this call created the run (its drive
    need not read it back), and the run's first lease when ``owner`` is given: a new run
    is created held by it (a claim saved), an existing one is left to the drive's claim."""
    (found,) = record_starts(host, [start], owner)
    if isinstance(found, BaseException):
        raise found
    return found


def record_starts(
    host: DriveHost, starts: Sequence[StartRecord], owner: str | None = None
) -> list[Started | Exception | None]:
    """``record_start`` of several runs at once (an async loop's starts of one turn): the
    new runs' witness rows in one write, then their rows and first records in one store
    transaction (``create_runs``, where the store has it), with the crash points of each
    on both sides. Per run: what ``record_start`` returns, or the error that refused it
    alone (RunConflict, a run lost from the journal, a run driven here already)."""
    store, witness, points = host.store, host.witness, host.crash_points
    out: list[Started | Exception | None] = [None] * len(starts)
    ids = [start.row.run_id for start in starts]
    rows = _found(getattr(store, "get_runs", None), store.get_run, ids)
    existing = {i: rows[run_id] for i, run_id in enumerate(ids) if run_id in rows}
    absent = [i for i in range(len(starts)) if i not in existing]
    # A witness that reads and starts a new run in one round trip (PostgreSQL: the runs
    # that start at once share it) is asked so here; the others are read, then started.
    unseen = getattr(witness, "start_unseen", None)
    seen: dict[str, int] = {}
    if witness is not None and unseen is None:
        seen = _found(getattr(witness, "get_many", None), witness.get, [ids[i] for i in absent])
    new: list[int] = []
    for i in absent:
        witnessed = unseen(ids[i]) if unseen is not None else seen.get(ids[i])
        if witnessed:  # lost from the journal: never a second start (none was made)
            out[i] = lost(ids[i], witnessed)
            continue
        new.append(i)
    if new and witness is not None and unseen is None:  # generation 0, before the first
        _start_witnessed(witness, [starts[i].row.run_id for i in new])  # commit
    if new and points is not None:  # resuming commits nothing here: no crash point
        for _ in new:
            points.hit("before_commit[run_started]")
    held: dict[int, Lease | None] = {}
    for i in new:
        try:
            held[i] = (
                None
                if owner is None
                else leases.first(owner, starts[i].row.run_id, host.lease_seconds)
            )
        except CrashproofError as exc:  # this run is driven here already
            out[i] = exc
    creating = [i for i in new if i in held]
    try:
        made = _create_runs(store, [(starts[i].row, starts[i].first, held[i]) for i in creating])
        if points is not None:
            for row in made:
                if row is None:
                    points.hit("after_commit[run_started]")
    except BaseException:  # a crash leaves the leases in the store to expire, as a drive's
        for i, lease in held.items():
            if lease is not None:
                leases.stop_driving(lease.owner, starts[i].row.run_id)
        raise
    for i, row in zip(creating, made, strict=True):
        lease = held[i]
        if row is None:
            log.info(
                "run started",
                extra={"run_id": starts[i].row.run_id, "workflow": starts[i].workflow},
            )
            out[i] = (starts[i].first, lease)
            continue
        if lease is not None:  # created meanwhile by another drive: claimed as any other
            leases.stop_driving(lease.owner, starts[i].row.run_id)
        existing[i] = row
    for i, row in existing.items():
        if row.input_digest != starts[i].row.input_digest:
            out[i] = RunConflict(starts[i].row.run_id, row.input_digest, starts[i].row.input_digest)
    _rolled_past_starts(host, out)
    return out


def _rolled_past_starts(host: DriveHost, out: list[Started | Exception | None]) -> None:
    """A drive that created its run and holds its first lease reads no journal back (the
    start record is all of it) and rolls the witness past that record as
    ``journal(owner=True)`` would (``Ledger._open``): one synced witness write per run,
    on the loop's thread for an async batch. Several such runs are rolled here in one
    write, which their openings then find made."""
    witness = host.witness
    many = getattr(witness, "advance_many", None)
    if many is None or host.durability == "output":
        return
    held = {
        found[0].run_id: 1
        for found in out
        if isinstance(found, tuple) and found[1] is not None and found[1].token == 1
    }
    if len(held) > 1:
        many(held)


def _found(
    many: Callable[[list[str]], dict[str, T]] | None,
    one: Callable[[str], T | None],
    run_ids: list[str],
) -> dict[str, T]:
    """What ``one`` finds of each run, in one read where the store or witness has
    ``many`` (SQLiteStore.get_runs, SQLiteWitness.get_many): those found, by run id."""
    if many is not None and len(run_ids) > 1:
        return many(run_ids)
    got = {run_id: one(run_id) for run_id in run_ids}
    return {run_id: value for run_id, value in got.items() if value is not None}


def _start_witnessed(witness: Witness, run_ids: list[str]) -> None:
    many = getattr(witness, "start_many", None)
    if many is not None and len(run_ids) > 1:
        many(run_ids)  # one write for all
    else:
        for run_id in run_ids:
            witness.start(run_id)


def _create_runs(
    store: Store, runs: list[tuple[RunRow, Event, Lease | None]]
) -> list[RunRow | None]:
    many = getattr(store, "create_runs", None)
    if many is not None and len(runs) > 1:
        return many(runs)  # type: ignore[no-any-return]  # one transaction for all
    return [store.create_run(row, first, lease) for row, first, lease in runs]


def recorded_outcome(run_id: str, replay: Replay) -> Callable[[], Any] | None:
    """For a run that already ended: a thunk returning its result or raising its outcome."""
    event = replay.outcome
    if event is None:
        return None
    if event.type is EventType.RUN_SUCCEEDED:
        value = event.value
        return lambda: value
    if event.type is EventType.RUN_FAILED:
        error = payloads.run_failed(event).get("error") or {}

        def failed() -> Any:
            raise RunFailed(run_id, error)

        return failed
    halted = payloads.frozen_or_stopped(event)
    status = str(halted.get("status", RunStatus.NEEDS_REVIEW.value))
    reason = str(halted.get("reason", ""))
    evidence = halted.get("evidence")

    # The cause is the same kind of error the workflow saw when the run froze.
    recorded = halted.get("error")
    cause = error_from_record(recorded) if isinstance(recorded, dict) else None
    if isinstance(cause, NonDeterminismError):
        cause.evidence = evidence or {}

    def frozen() -> Any:
        raise RunFrozen(run_id, status, reason, cause, evidence=evidence)

    return frozen


def stopped_error(
    run_id: str, cause: CrashproofError | None, evidence: dict[str, Any] | None
) -> CrashproofError:
    """What a drive that stopped on ``cause`` (a freeze, a budget, an abort: journaled
    already) raises to its caller."""
    if isinstance(cause, RunFailed):  # a reviewer's abort, journaled (runtime/guards/review.py)
        return cause
    if isinstance(cause, Unverified):  # completion evidence missing (guards/completion.py)
        return Unverified(run_id, cause.reason, problems=cause.problems)
    if isinstance(cause, RunStopped):  # a clean stop (a budget), not a freeze
        return RunStopped(
            run_id,
            cause.reason,
            cause.budget,
            cause.limits,
            wall_seconds=cause.wall_seconds,
            detail=cause.detail,
        )
    status = (
        RunStatus.AWAITING_APPROVAL
        if isinstance(cause, ApprovalRequired)
        else RunStatus.NEEDS_REVIEW
    )
    return RunFrozen(run_id, status.value, str(cause), cause, evidence=evidence)
