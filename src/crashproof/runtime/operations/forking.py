"""Forking a run from a step (``Ledger.fork``, ``crashproof fork RUN --from STEP --run-id
NEW``): a new run whose journal is the old one's prefix, up to and including the record
of that step (DBOS's fork-from-step, LangGraph's time travel).

The prefix is copied record by record under the new run id and committed through the
store like any append, so it is sealed and HMAC-chained as the new run's own journal
(and witnessed from generation 0). Its acts keep their receipts and operation ids (the
operation id is in each record): ``crashproof resume NEW`` replays them, executing
nothing. Acts after the prefix run live, and their operation ids derive from the new run
id (``runtime/steps/acts.py``: ``RUN/KEY``), so no target mistakes them for the source's.
Outbox messages of the prefix that the source delivered later are marked delivered in
the fork too (never sent twice). The last record, ``run_forked``, names the source run,
step and sequence, who and where.

Before forking, ``fork_preview`` (``crashproof fork --dry-run``, the console's Fork
form) lists the acts that will run again: the source's acts after the cut, each of
which a resume of the fork executes live (under the fork's operation ids) if the code
still makes it.

Refused, with nothing written (``cp.ForkRefused``): a step the source never completed,
a prefix that ends inside an act (an intent without a receipt, UNKNOWN), a new run id
in use or reserved.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from crashproof.errors import ForkRefused, RunNotFound
from crashproof.journal import payloads
from crashproof.journal.codec import storable
from crashproof.journal.fold import Replay, index_journal
from crashproof.journal.records import (
    Event,
    EventType,
    RunRow,
    RunStatus,
    StepKind,
    with_request,
)
from crashproof.runtime.driving.leases import operator_lease
from crashproof.runtime.guards.approvers import reserved
from crashproof.runtime.guards.budget import operator
from crashproof.runtime.port import DriveHost

__all__ = ["LedgerFork", "fork_plan"]


def _as(run_id: str, seq: int, event: Event) -> Event:
    return Event(
        run_id, seq, event.type, event.key, event.payload, event.created_at, event.value_json
    )


def fork_plan(
    run_id: str, events: list[Event], from_step: str
) -> tuple[int, Replay, list[dict[str, Any]]]:
    """Where a fork of ``run_id`` from ``from_step`` cuts its journal, the prefix's index,
    and the acts that will run again: those the source attempted after the cut (each
    once, in order: step, tool, the source's operation id and how it ended), which a
    resume of the fork runs live under the new run's operation ids, if the code still
    makes them. Refused (``ForkRefused``) as ``fork`` refuses; reads only."""
    done = [e for e in index_journal(events).done if e.key == from_step]
    if not done:
        raise ForkRefused(
            run_id,
            f"run {run_id!r} has no completed step {from_step!r}; nothing was written "
            f"(`crashproof show {shlex.quote(run_id)}` lists its steps)",
        )
    cut = done[0].seq
    prefix = index_journal(events[: cut + 1])
    if prefix.open_acts:
        inside = ", ".join(sorted(prefix.open_acts))
        raise ForkRefused(
            run_id,
            f"the prefix up to {from_step!r} ends inside act(s) {inside} (an intent "
            "without a receipt); nothing was written: fork from an earlier step, or "
            f"reconcile {run_id!r} first",
        )
    again: dict[str, dict[str, Any]] = {}
    for event in events[cut + 1 :]:
        if event.type is EventType.ACT_INTENT and event.key is not None:
            intent = payloads.act_intent(event)
            again.setdefault(
                event.key,
                {
                    "step": event.key,
                    "tool": intent.get("tool"),
                    "operation_id": intent.get("operation_id"),
                    "ended": "in flight",
                },
            )
        elif event.type is EventType.STEP_DONE and event.key is not None:
            step = payloads.step_done(event)
            if step.get("kind") != StepKind.ACT.value:
                continue
            entry = again.setdefault(
                event.key,
                {"step": event.key, "tool": None, "operation_id": step.get("operation_id")},
            )
            entry["ended"] = step.get("status") + (
                f" ({step['failure']})" if step.get("failure") else ""
            )
    return cut, prefix, list(again.values())


class LedgerFork(DriveHost):
    """``Ledger.fork`` (see the module docstring)."""

    def fork_preview(self, run_id: str, *, from_step: str) -> list[dict[str, Any]]:
        """The acts a fork of ``run_id`` from ``from_step`` will run again
        (``fork_plan``), nothing written; ``ForkRefused`` where ``fork`` would refuse."""
        if self.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")
        return fork_plan(run_id, self.journal(run_id), from_step)[2]

    def fork(
        self, run_id: str, *, from_step: str, new_run_id: str, by: str | None = None
    ) -> dict[str, Any]:
        """Start ``new_run_id`` from ``run_id``'s journal up to and including step
        ``from_step``; returns the ``run_forked`` record's payload. Drive it on with
        ``resume(new_run_id)``. Refusals raise ``ForkRefused``, nothing written."""
        who = operator(by)
        if (
            not isinstance(new_run_id, str)
            or not new_run_id
            or reserved(new_run_id)
            or not storable(new_run_id)  # a NUL or a lone surrogate: no store keeps it
        ):
            raise ForkRefused(run_id, f"--run-id {new_run_id!r} is not a usable run id")
        if self.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")
        if self.store.get_run(new_run_id) is not None:
            raise ForkRefused(
                run_id, f"run {new_run_id!r} exists already; nothing was written: pick another id"
            )
        events = self.journal(run_id)
        cut, prefix, _ = fork_plan(run_id, events, from_step)
        kept = self.store.load_requests(run_id)  # the prefix's requests go with it
        copied = [
            with_request(_as(new_run_id, e.seq, e), kept.get(e.seq)) for e in events[: cut + 1]
        ]
        pending = set(prefix.undelivered)
        for event in events[cut + 1 :]:  # delivered later: never delivered twice
            if event.type is EventType.OUTBOX_DELIVERED and event.key in pending:
                copied.append(_as(new_run_id, len(copied), event))
        record = {
            "by": who["by"],
            "host": who["host"],
            "time": time.time(),
            "from_run": run_id,
            "from_step": from_step,
            "from_seq": cut,
        }
        copied.append(
            Event(new_run_id, len(copied), EventType.RUN_FORKED, None, record, time.time())
        )
        started = payloads.run_started(copied[0])
        now = time.time()
        row = RunRow(
            run_id=new_run_id,
            workflow=str(started.get("workflow")),
            version=str(started.get("version")),
            status=RunStatus.RUNNING,
            input_digest=str(started.get("input_digest")),
            created_at=now,
            updated_at=now,
        )
        if self.witness is not None:
            self.witness.start(new_run_id)
        if self.store.create_run(row, copied[0]) is not None:
            raise ForkRefused(run_id, f"run {new_run_id!r} exists already; nothing was written")
        with operator_lease(self.store, new_run_id, self.worker_id, self.lease_seconds) as lease:
            self.append_records(copied[1:], None, fencing_token=lease.token)
        self.store.sync()
        return record
