"""A run's two ends as a drive meets them: its start record, and the answer of a run
that has already ended (its result again, or the error it ended with)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

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
from crashproof.integrity.witness import lost
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest, encode, error_from_record
from crashproof.journal.fold import Replay
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.runtime.driving import leases
from crashproof.runtime.port import DriveHost
from crashproof.runtime.workflow import Workflow
from crashproof.store.port import Lease

__all__ = ["Started", "record_start", "recorded_outcome", "stopped_error"]

# A run this call created: its start record, and the lease it was created under.
Started = tuple[Event, Lease | None]

log = logging.getLogger(__name__)


def record_start(
    host: DriveHost,
    workflow: Workflow[Any],
    run_id: str,
    input: dict[str, Any],
    fields: dict[str, Any],
    owner: str | None = None,
) -> Started | None:
    """Record the run's start (``fields``: its limits and policy, and who starts it)
    unless it exists with the same input; another input raises RunConflict. Returns the
    start record when this call created the run (its drive need not read it back), and
    the run's first lease when ``owner`` is given: a new run is created held by it (a
    claim saved), an existing one is left to the drive's claim."""
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
    store, witness, points = host.store, host.witness, host.crash_points
    new = store.get_run(run_id) is None
    if new and witness is not None:
        witnessed = witness.get(run_id)
        if witnessed:  # lost from the journal: never a second start
            raise lost(run_id, witnessed)
        witness.start(run_id)  # generation 0, before the run's first commit
    if new and points is not None:  # resuming commits nothing here: no crash point
        points.hit("before_commit[run_started]")
    lease = None if owner is None or not new else leases.first(owner, run_id, host.lease_seconds)
    try:
        existing = store.create_run(row, first, lease)
        if existing is None and points is not None:
            points.hit("after_commit[run_started]")
    except BaseException:  # a crash leaves the lease in the store to expire, as a drive's
        if lease is not None:
            leases.stop_driving(lease.owner, run_id)
        raise
    if existing is None:
        log.info("run started", extra={"run_id": run_id, "workflow": workflow.name})
        return first, lease
    if lease is not None:  # created meanwhile by another drive: claimed as any other
        leases.stop_driving(lease.owner, run_id)
    if existing.input_digest != digest:
        raise RunConflict(run_id, existing.input_digest, digest)
    return None


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
