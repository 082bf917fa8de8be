"""Moving a run between ledgers: an export is a move unless it is a copy.

A checkpoint taken of a live ledger is stale the moment the run goes on, and a stale
checkpoint resumed elsewhere repeats every effect the source did after it (a checkpoint
taken before the first act holds no observation of the environment at all). So an
export is a **move** by default: under the run's lease, the source journals
``run_moved`` (an output point: synced, witnessed, before the document leaves the
process), and from then on this ledger drives and changes the run no more — ``run``,
``resume``, workers, approvals, decisions and outbox dispatch all refuse it with
``RunMoved``. The document ends with that record, so the importing ledger knows it holds
the run's one continuation. Exporting a moved run again re-emits the same document
(same records, same digest): a crash after the move's commit and before the document
was written loses nothing.

``export --copy`` writes nothing: a copy is for backups, inspection and ``replay --from``;
imported, it is frozen until a human decides (``crashproof.runtime.operations.transfer``).
Importing a move back into the ledger it left brings the run back here.

What no local check can stop: the same move document imported into two ledgers gives
two continuations. A move is only as single as the file that carries it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from crashproof.errors import RunMoved
from crashproof.integrity import checkpoint
from crashproof.journal import payloads
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.driving.leases import operator_lease
from crashproof.runtime.guards.budget import operator
from crashproof.runtime.operations.transfer import arrival_events, checkpoint_digest, folded_status
from crashproof.store.port import Store

if TYPE_CHECKING:
    from crashproof.runtime.port import DriveHost

__all__ = ["move_back", "move_out", "moved_error", "refuse_moved"]

log = logging.getLogger("crashproof.runtime.ledger")


def moved_error(store: Store, run_id: str, moved: Event) -> RunMoved:
    """The refusal for a run whose journal ends with ``moved``."""
    payloads.expect(moved, EventType.RUN_MOVED)
    when = float(payloads.run_moved(moved).get("time", moved.created_at))
    return RunMoved(
        run_id,
        generation=moved.seq + 1,
        checkpoint=checkpoint_digest(store, run_id),
        by=str(payloads.run_moved(moved).get("by")),
        moved_at=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when)),
    )


def refuse_moved(store: Store, run_id: str, events: list[Event]) -> None:
    """Raise ``RunMoved`` when the run left this ledger (its journal ends with a move):
    nothing may be driven, decided or delivered here any more."""
    if events and events[-1].type is EventType.RUN_MOVED:
        raise moved_error(store, run_id, events[-1])


def move_out(ledger: DriveHost, run_id: str, by: str | None) -> bool:
    """Journal the run's move under its lease (``LeaseHeld`` if a live worker holds it;
    a holder that is provably gone is taken over and fenced out). Returns False when the
    run had already moved (nothing written)."""
    who = operator(by)
    with operator_lease(ledger.store, run_id, ledger.worker_id, ledger.lease_seconds) as lease:
        events = ledger.journal(run_id)
        if events[-1].type is EventType.RUN_MOVED:  # moved meanwhile: the same document
            moved = False
        else:
            events = ledger.journal(run_id, owner=True)  # the witness rolled forward
            now = time.time()
            event = Event(
                run_id=run_id,
                seq=len(events),
                type=EventType.RUN_MOVED,
                key=None,
                payload={
                    **who,
                    "time": now,
                    "generation": len(events) + 1,
                    "left": _status_before(events),
                },
                created_at=now,
            )
            reason = f"exported as a move at generation {len(events) + 1} by {who['by']}"
            ledger.append_records([event], (RunStatus.MOVED, reason), fencing_token=lease.token)
            moved = True
    if moved:
        log.info("run moved out", extra={"run_id": run_id, "by": who["by"]})
    return moved


def _status_before(events: list[Event]) -> str:
    outcome = index_journal(events).outcome
    if outcome is None:
        return RunStatus.RUNNING.value
    if outcome.type is EventType.RUN_SUCCEEDED:
        return RunStatus.SUCCEEDED.value
    if outcome.type is EventType.RUN_FAILED:
        return RunStatus.FAILED.value
    return str(payloads.frozen_or_stopped(outcome).get("status", RunStatus.NEEDS_REVIEW.value))


def move_back(ledger: DriveHost, found: checkpoint.Checkpoint, by: str) -> str:
    """A move imported into the ledger it left (its journal is exactly the document's):
    journal the arrival under the run's lease; the run is driven here again."""
    run_id = found.run.run_id
    with operator_lease(ledger.store, run_id, ledger.worker_id, ledger.lease_seconds) as lease:
        events = ledger.journal(run_id)
        if events[-1].type is EventType.RUN_MOVED and len(events) == len(found.records):
            arrival = arrival_events(found, by, len(events))
            status = folded_status(run_id, [*events, *arrival])
            ledger.append_records(arrival, status, fencing_token=lease.token)
            ledger.store.sync()  # as an install: durable, then witnessed
            if ledger.witness is not None:
                ledger.witness.advance(run_id, len(events) + len(arrival))
            log.info("moved run returned", extra={"run_id": run_id, "by": by})
    return run_id
