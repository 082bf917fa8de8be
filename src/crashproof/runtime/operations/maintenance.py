"""The Ledger's care of what it already holds: verifying journals (check), re-anchoring
witnesses, reconciling receipts with their tools, delivering pending outbox messages,
and moving runs between ledgers as signed checkpoints. A mixin of ``Ledger``: it reads
the store, witness and journal through the attributes the Ledger sets."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from crashproof.errors import AsyncMisuse, CrashproofError, IntegrityError, LeaseHeld, RunNotFound
from crashproof.integrity.witness import lost
from crashproof.journal import payloads
from crashproof.journal.fold import fold_run, index_journal
from crashproof.journal.records import Event, EventType, RunInfo, RunStatus
from crashproof.runtime.driving.leases import Heartbeat, claim, release, stop_driving
from crashproof.runtime.guards.approvers import reserved
from crashproof.runtime.operations.reconciling import record_findings
from crashproof.runtime.operations.request_check import check_requests
from crashproof.runtime.port import DriveHost
from crashproof.runtime.steps.handoff import async_methods, run_async, run_sync
from crashproof.runtime.steps.outbox import deliver
from crashproof.runtime.steps.reconcile import ActCheck, reconcile_events
from crashproof.tools.port import Tool

if TYPE_CHECKING:
    from crashproof.runtime.operations.transfer import ImportPlan

__all__ = ["LedgerCare"]

log = logging.getLogger("crashproof.runtime.ledger")


class LedgerCare(DriveHost):
    """Maintenance operations of a Ledger (see the module docstring)."""

    def get_run(self, run_id: str) -> RunInfo:
        """Everything known about a run, folded from its journal."""
        row = self.store.get_run(run_id)
        if row is None:
            raise self.missing(run_id)
        return fold_run(row, self.journal(run_id, results=False))  # StepInfo has none

    def runs(self, status: RunStatus | str | None = None) -> list[RunInfo]:
        """All runs, oldest first, optionally only those of one status."""
        wanted = RunStatus(status) if status is not None else None
        rows = [row for row in self.store.list_runs() if not reserved(row.run_id)]
        infos = [fold_run(row, self.journal(row.run_id, results=False)) for row in rows]
        # Filtered on the status folded from each journal, not on the index row's cache.
        return [info for info in infos if wanted is None or info.status is wanted]

    def reconcile(
        self, run_id: str, tools: Iterable[Tool], *, record: bool = False, by: str | None = None
    ) -> list[ActCheck]:
        """Ask each tool to look up each act the run recorded: ``confirmed``, ``drifted``
        or ``needs_review`` per act (see ``crashproof.runtime.steps.reconcile``).
        Read-only, unless ``record``: then each finding is journaled in the run, attributed
        to ``by`` (``runtime/operations/reconciling.py``; ``LeaseHeld`` while another
        process drives it)."""
        if self.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")
        checks = reconcile_events(run_id, self.journal(run_id), tools)
        if record:
            record_findings(self, run_id, checks, by)
        return checks

    def dispatch_outbox(self, tools: Iterable[Tool], runs: Iterable[str] | None = None) -> int:
        """Deliver the pending outbox messages of runs no process is driving (ended or
        frozen; a running run delivers its own on resume); ``runs``: only these. Returns
        how many were delivered; failures stay pending and are journaled."""
        by_name = {tool.name: tool for tool in tools}
        delivered = 0
        wanted = None if runs is None else set(runs)
        for row in self.store.list_runs():
            if wanted is not None and row.run_id not in wanted:
                continue
            if row.status not in (RunStatus.RUNNING, RunStatus.QUEUED, RunStatus.MOVED):
                delivered += self._dispatch_run(row.run_id, by_name)
        return delivered

    def _dispatch_run(self, run_id: str, tools: dict[str, Tool]) -> int:
        """Deliver one run's pending messages under its lease: two dispatchers (or a
        dispatcher and a resume) never deliver the same run's messages at once."""
        if not index_journal(self.journal(run_id)).undelivered:
            return 0  # the common case: no lease taken, nothing written
        try:
            lease = claim(self.store, run_id, self.worker_id, self.lease_seconds, False).lease
        except LeaseHeld:
            log.info("outbox skipped: the run is held", extra={"run_id": run_id})
            return 0
        heartbeat = Heartbeat(self.store, run_id, lease, lambda: None)
        try:
            return self._deliver_pending(run_id, tools, lease.token)
        finally:
            heartbeat.stop()
            stop_driving(lease.owner, run_id)
            release(self.store, run_id, heartbeat.lease)

    def _deliver_pending(self, run_id: str, tools: dict[str, Tool], token: int) -> int:
        replay = index_journal(self.journal(run_id, owner=True))
        next_seq = replay.next_seq

        def append(type_: EventType, key: str, payload: dict[str, Any]) -> None:
            nonlocal next_seq
            event = Event(
                run_id=run_id,
                seq=next_seq,
                type=type_,
                key=key,
                payload=payload,
                created_at=time.time(),
            )
            self.append_records((event,), None, fencing_token=token)
            next_seq += 1

        delivered = 0
        if replay.undelivered:  # a crashed process may have left them unsynced
            self.store.sync()
        for key, event in replay.undelivered.items():
            outbox = payloads.step_done(event)["outbox"]
            tool = tools.get(outbox["tool"])
            digest = payloads.step_done(event)["digest"]
            if tool is None:
                continue
            work = deliver(append, run_id, key, tool, outbox["message"], digest)
            if _on_private_loop(tool, run_id, key):
                done = asyncio.run(run_async(work))
            else:
                done = run_sync(work)
            delivered += done
        return delivered

    def check(self, run_id: str | None = None) -> list[tuple[str, str | None]]:
        """Verify every record of every run (or one run): MAC, chain, sequence, witness,
        and each model request kept beside a record against the digest the record holds.
        Returns ``(run_id, None)`` for each sound run and ``(run_id, problem)`` for each
        other one; never raises for a bad run, never writes. Every run the witness saw
        is checked too: one the journal lost entirely is a problem, never all clear."""
        witnessed = self.witness.known() if self.witness is not None else {}
        # Generation 0: the witness row written before a first commit that never came.
        lost_runs = {rid: gen for rid, gen in witnessed.items() if gen > 0}
        if run_id is not None:
            if self.store.get_run(run_id) is None and run_id not in lost_runs:
                raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")
            ids = [run_id]
        else:
            ids = [r.run_id for r in self.store.list_runs()]
            ids += sorted(set(lost_runs) - set(ids))
        report: list[tuple[str, str | None]] = []
        for rid in ids:
            try:
                if rid in lost_runs and self.store.get_run(rid) is None:
                    raise lost(rid, lost_runs[rid])
                events = self.journal(rid, results=False)  # every MAC verified still
                index_journal(events)
                # The kept requests, against the digests their verified records hold.
                check_requests(self.store, rid, events, partial(self.journal, rid, results=False))
            except IntegrityError as exc:
                report.append((rid, f"{type(exc).__name__}: {exc}"))
            else:
                report.append((rid, None))
        return report

    def missing(self, run_id: str) -> CrashproofError:
        """The error for a run the journal does not hold: lost (``JournalRolledBack``)
        when the witness saw it commit, else ``RunNotFound``."""
        witnessed = self.witness.get(run_id) if self.witness is not None else None
        if witnessed:
            return lost(run_id, witnessed)
        return RunNotFound(f"no run {run_id!r} in {self.shown_url}")

    def reanchor(self, run_id: str, *, by: str) -> int:
        """Trust a run's journal as it is now: set its witness to the journal's
        generation. An explicit, logged operator action (after a witness was lost, or a
        journal deliberately restored); the journal must still verify."""
        if not by:
            raise ValueError("reanchor needs by=NAME: who takes responsibility")
        events = self.store.load_events(run_id)  # MACs and chain still verified
        if not events:
            raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")
        if self.witness is None:
            raise ValueError(f"ledger {self.shown_url} has no generation witness to re-anchor")
        before = self.witness.get(run_id)
        self.store.sync()  # the witness is never ahead of what a power cut leaves
        self.witness.reset(run_id, len(events))
        log.warning(
            "witness re-anchored",
            extra={"run_id": run_id, "by": by, "from": before, "to": len(events)},
        )
        return len(events)

    def export_run(
        self, run_id: str, *, copy: bool = False, by: str | None = None
    ) -> dict[str, Any]:
        """The run as one signed checkpoint document (``crashproof.integrity.checkpoint``):
        its journal records exactly as stored, each with its chain MAC; the journal and
        its witness are verified first.

        A **move** by default (``crashproof.runtime.operations.moving``): under the run's lease
        (``LeaseHeld`` while a live worker drives it) the journal records that the run
        left with this document (``by``: who; default the OS user), and this ledger
        refuses to drive it from then on (``RunMoved``); the importing ledger holds its
        one continuation. Exporting a moved run again returns the same document.
        ``copy=True``: nothing is written (backups, inspection, ``replay --from``); an
        imported copy stays frozen until a human decides."""
        from crashproof.runtime.operations import moving, transfer

        if self.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r} in {self.shown_url}")
        transfer.capable(self.store)  # a ledger that cannot export moves nothing
        events = self.journal(run_id)  # MACs, chain and generation checked before export
        if not copy and events[-1].type is not EventType.RUN_MOVED:
            moving.move_out(self, run_id, by)
        return transfer.export_run(self.store, run_id)

    def import_run(self, document: dict[str, Any], *, by: str) -> str:
        """Install a run from a checkpoint document; returns its run id. Verifies the
        signature first, then format, schema version, fields, every record's MAC and the
        chain, and the generation; any mismatch raises a ``CheckpointRejected`` (or
        ``UnknownKeyId``) naming it, with nothing written. A run that already exists is
        refused unless its journal equals the checkpoint's (then: nothing to do) or
        holds its import. The arrival is journaled (``run_imported``: ``by``, the
        checkpoint's digest, move or copy); a copy of a run that has not ended is
        installed frozen (``needs_review``) until a signed ``continue`` or ``abort``; a
        move returning to the ledger it left makes the run runnable here again. The
        witness is set to the new generation."""
        from crashproof.runtime.operations import moving, transfer

        plan, found = transfer.plan_import(self.store, self.witness, document)
        if plan.action == "return":
            if not by:
                raise ValueError("import_run needs by=NAME: who takes responsibility")
            return moving.move_back(self, found, by)
        return transfer.import_run(self.store, self.witness, document, by=by)

    def preview_import(self, document: dict[str, Any]) -> ImportPlan:
        """What ``import_run(document)`` would do (the run, its generation, a format
        migration, the derived header fields, install or nothing to do), verified exactly
        as an import is; nothing is written."""
        from crashproof.runtime.operations import transfer

        return transfer.preview_import(self.store, self.witness, document)


def _on_private_loop(tool: Tool, run_id: str, key: str) -> bool:
    """An async delivery (``cp.Outbox`` with an async ``deliver``) runs on a loop of its
    own: this pass is sync. Refused inside a running loop, which it would block."""
    if not async_methods(tool):
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    raise AsyncMisuse(
        f"outbox {tool.name!r} delivers asynchronously and dispatch_outbox was called on a "
        f"running event loop (run {run_id!r}, step {key!r}); nothing was delivered. Call "
        "it off the loop: await asyncio.to_thread(ledger.dispatch_outbox, tools)"
    )
