"""Retrying a failed run under its own id (``Ledger.retry``, ``crashproof retry RUN``).

A run recorded ``failed`` is re-driven, never restarted under a new id: its journal
holds the intents and receipts that keep its effects single (a pull request opened
before the failure is replayed from its receipt, not opened again). The retry is an
operator decision, journaled under the drive's lease before anything runs: a
``run_retried`` record (who, host, the failed call it attempts again; the error is in
the ``run_failed`` record before it), sealed and chained like every record and shown in the audit
timeline. The fold (journal/fold.py) then reads the run as running again, and drops the
failed call's record from the replay sequence: the run's last recorded call, when it
failed (its error ended the run), is attempted again with a fresh count of attempts.
Every other record replays as it is: steps, decisions, acts, and the failures the
workflow caught. A run whose workflow raised on its own (its last call succeeded) is
driven again from the top, which helps once the code that raised is fixed.

Refused, with nothing written (``cp.RetryRefused``): a run that is not failed (resume a
stopped or running one; a succeeded one is done) and a run a reviewer aborted (a signed
decision to end it, which a retry must not undo).
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from crashproof.errors import RetryRefused
from crashproof.journal import payloads
from crashproof.journal.fold import Replay
from crashproof.journal.records import Event, EventType, RunStatus, StepStatus

__all__ = ["not_failed", "retried_record"]


def not_failed(run_id: str, status: str) -> RetryRefused:
    """The refusal of a retry of a run in ``status``, with what to do instead."""
    word = shlex.quote(run_id)  # pasted into a shell: a literal, whatever the id holds
    instead = {
        RunStatus.SUCCEEDED.value: "it succeeded: there is nothing to retry",
        RunStatus.CANCELLED.value: "it was cancelled: a cancelled run is never driven again",
        RunStatus.STOPPED.value: f"resume it: crashproof resume {word} --app MODULE",
        RunStatus.RUNNING.value: f"resume it: crashproof resume {word} --app MODULE",
        RunStatus.NEEDS_REVIEW.value: f"it waits for a review: crashproof review list {word}",
        RunStatus.AWAITING_APPROVAL.value: f"it waits for an approval: crashproof show {word}",
    }.get(status, f"see crashproof show {word}")
    return RetryRefused(
        run_id,
        status,
        f"run {run_id!r} is {status}, not failed: only a failed run is retried, and nothing "
        f"was changed; {instead}",
    )


def retried_record(run_id: str, replay: Replay, who: dict[str, Any]) -> Event:
    """The ``run_retried`` record re-driving ``run_id`` (read under its lease), or
    ``RetryRefused`` when the journal does not end failed."""
    outcome = replay.outcome
    if outcome is None or outcome.type is not EventType.RUN_FAILED:
        state = "running" if outcome is None else payloads.run_state(outcome).get("status")
        if outcome is not None and outcome.type is EventType.RUN_SUCCEEDED:
            state = RunStatus.SUCCEEDED.value
        raise not_failed(run_id, str(state or "running"))
    failed = payloads.run_failed(outcome)
    if "review" in failed:
        raise RetryRefused(
            run_id,
            RunStatus.FAILED.value,
            f"run {run_id!r} was aborted by a reviewer's signed decision; a retry would undo "
            f"it, so nothing was changed. See crashproof review list {shlex.quote(run_id)}",
        )
    last = replay.done[-1] if replay.done else None
    if last is not None and payloads.step_done(last)["status"] != StepStatus.FAILED:
        last = None  # the workflow raised on its own: driven again from the top
    payload = payloads.RunRetried(
        by=who["by"],
        host=who["host"],
        status=RunStatus.RUNNING.value,
        retried=None if last is None else last.key,
        failed_seq=None if last is None else last.seq,
    )
    return Event(
        run_id=run_id,
        seq=replay.next_seq,
        type=EventType.RUN_RETRIED,
        key=None,
        payload=payloads.as_dict(payload),
        created_at=time.time(),
    )
