"""Cancelling a run for good (``Ledger.cancel``, ``crashproof cancel RUN``). A mixin of
``Ledger``.

A cancel is an operator decision, journaled like a retry: a ``run_cancelled`` record
(who, host, time, why, and the acts it left in flight), sealed and chained like every
record, and the run's status ``cancelled`` in the index. It takes the run's lease over
(``take_over``: the fencing token moves on), so a driver that held it at that moment can
commit nothing afterwards: its next append raises ``StaleLeaseError``. An act whose intent
is journaled without a receipt stays as it is, for reconciliation (``crashproof show``
lists it as in flight); the cancel never guesses whether it happened.

A cancelled run is never driven again: ``resume``, ``retry``, a worker and ``run`` with
the same id raise ``RunCancelled`` (the drive checks the journal under its lease, before
writing anything), and the queue skips it (its status is no longer ``running``).

Refused, with nothing written (``cp.CancelRefused``): a run that has ended (succeeded,
failed, cancelled) and a run moved to another ledger.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from crashproof.errors import CancelRefused, RunCancelled, RunNotFound
from crashproof.journal.fold import Replay, cancelled_reason, index_journal
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.driving.leases import operator_lease
from crashproof.runtime.guards.budget import operator
from crashproof.runtime.operations.forking import LedgerFork

__all__ = ["LedgerCancel", "cancelled", "refuse_cancelled"]


def cancelled(replay: Replay) -> Event | None:
    """The ``run_cancelled`` record the run ends on, if it was cancelled."""
    outcome = replay.outcome
    if outcome is not None and outcome.type is EventType.RUN_CANCELLED:
        return outcome
    return None


def refuse_cancelled(run_id: str, replay: Replay) -> None:
    """Raise ``RunCancelled`` when the run was cancelled: it is never driven again."""
    event = cancelled(replay)
    if event is not None:
        p = event.payload
        raise RunCancelled(run_id, str(p.get("by", "")), str(p.get("reason", "")))


def _ended(replay: Replay) -> str | None:
    """The status a journal ended on (succeeded, failed, cancelled), or None."""
    outcome = replay.outcome
    if outcome is None:
        return None
    if outcome.type is EventType.RUN_SUCCEEDED:
        return RunStatus.SUCCEEDED.value
    if outcome.type is EventType.RUN_FAILED:
        return RunStatus.FAILED.value
    if outcome.type is EventType.RUN_CANCELLED:
        return RunStatus.CANCELLED.value
    return None


def _refusal(run_id: str, status: str) -> CancelRefused:
    return CancelRefused(
        run_id,
        status,
        f"run {run_id!r} is {status}: only a run that has not ended is cancelled, and "
        f"nothing was changed; `crashproof show {shlex.quote(run_id)}` shows how it ended",
    )


class LedgerCancel(LedgerFork):
    """``Ledger.cancel``, and ``Ledger.fork`` beside it (the two operator actions of issue
    25, one base of ``Ledger``)."""

    def cancel(self, run_id: str, *, by: str | None = None, reason: str = "") -> dict[str, Any]:
        """Stop ``run_id`` for good: journal ``run_cancelled`` (``by``: default the OS user,
        host, time, ``reason``) under its lease, taken over from any driver (fenced out).
        Returns the record's payload; ``in_flight`` names the acts left to reconciliation.
        A run that ended or moved raises ``CancelRefused``, nothing written."""
        if not isinstance(reason, str):
            raise TypeError("reason= must be a string")
        who = operator(by)
        row = self.store.get_run(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")
        if row.status.terminal or row.status is RunStatus.MOVED:
            raise _refusal(run_id, row.status.value)
        with operator_lease(
            self.store, run_id, self.worker_id, self.lease_seconds, take_over=True
        ) as lease:
            events = self.journal(run_id, owner=True)
            replay = index_journal(events)
            if replay.moved is not None:
                raise _refusal(run_id, RunStatus.MOVED.value)
            ended = _ended(replay)
            if ended is not None:  # it ended between the check and the lease
                raise _refusal(run_id, ended)
            payload = {
                "by": who["by"],
                "host": who["host"],
                "status": RunStatus.CANCELLED.value,
                "reason": reason,
                "in_flight": sorted(replay.open_acts),
            }
            event = Event(
                run_id=run_id,
                seq=replay.next_seq,
                type=EventType.RUN_CANCELLED,
                key=None,
                payload=payload,
                created_at=time.time(),
            )
            self.append_records(
                [event], (RunStatus.CANCELLED, cancelled_reason(payload)), fencing_token=lease.token
            )
        self.store.sync()
        return dict(payload)
