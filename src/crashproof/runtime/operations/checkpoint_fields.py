"""The run-header fields of a checkpoint (format 2) that are folded from its records.

A checkpoint's records are the source of truth; its run header repeats, for a reader
who does not fold journals, what those records say about the run:

- ``policy``: the binding in force (``{version, digest, identity}``, or null): the one
  recorded in ``run_started``, or the latest ``policy_rebound``;
- ``limits``: the run's limits as they stand (``run_started``, then ``budget_raised``),
  or null;
- ``budget_used``: steps, decisions, tokens and cost the recorded steps consumed;
- ``approvals``: how many approvals were granted and how many consumed;
- ``open_review_cases``: every review case still waiting (``open``) or decided but not
  yet consumed (``decided``): its id ``RUN#SEQ``, fingerprint, reason and state.

``status``, a field of every format, is folded too (``STATUS``, handed to the check
beside the five): export writes the status the records fold to, and import refuses any
other.

Export writes them; import derives them again and refuses a header that disagrees
(``crashproof.integrity.checkpoint.verify``); a version-1 checkpoint, which has none,
gets them derived (the 1→2 migration).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crashproof.integrity.checkpoint import Record
from crashproof.journal import payloads
from crashproof.journal.codec import decode
from crashproof.journal.fold import fold_run, index_journal, spend
from crashproof.journal.records import Budget, Event, EventType, RunRow, RunStatus
from crashproof.runtime.guards.review import cases_of

__all__ = ["STATUS", "WAITING_STATES", "derive_fields", "records_as_events"]

STATUS = "status"  # the key of the folded status in what derive_fields returns

WAITING_STATES = ("open", "decided")


def records_as_events(run_id: str, records: Sequence[Record]) -> list[Event]:
    """A checkpoint's records (verified: MACs and chain) as journal events, their payloads
    decoded now (a document's unreadable record fails its import, not a later read)."""
    return [
        Event(
            run_id=run_id,
            seq=r.seq,
            type=EventType(r.type),
            key=r.key,
            payload=decode(r.payload),
            created_at=r.created_at,
            value_json=r.value,
        )
        for r in records
    ]


def derive_fields(run_id: str, records: Sequence[Record]) -> dict[str, Any]:
    """The derived header fields of ``records`` (already verified: MACs and chain)."""
    events = records_as_events(run_id, records)
    replay = index_journal(events)
    budget = Budget()
    granted = consumed = 0
    for event in events:
        if event.type is EventType.STEP_DONE:
            budget = spend(budget, payloads.step_done(event))
        elif event.type is EventType.APPROVAL_GRANTED:
            granted += 1
        elif event.type is EventType.APPROVAL_CONSUMED:
            consumed += 1
    row = RunRow(
        run_id=run_id,
        workflow="",
        version="",
        status=RunStatus.RUNNING,
        input_digest="",
        created_at=0.0,
        updated_at=0.0,
    )
    return {
        STATUS: fold_run(row, events).status.value,
        "policy": replay.policy,
        "limits": replay.limits,
        "budget_used": {
            "steps": budget.steps,
            "decisions": budget.decisions,
            "tokens": budget.tokens,
            "cost": budget.cost,
        },
        "approvals": {"granted": granted, "consumed": consumed},
        "open_review_cases": [
            {
                "case_id": case.case_id,
                "fingerprint": case.fingerprint,
                "reason": case.reason,
                "state": case.state,
            }
            for case in cases_of(events)
            if case.state in WAITING_STATES
        ],
    }
