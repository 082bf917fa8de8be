"""Which workflow a resume drives, or the answer of a run that needs no drive. A mixin
of ``Ledger``: the checks a resume makes before it claims the run's lease."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crashproof.errors import CrashproofError, UnknownWorkflow
from crashproof.journal import payloads
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, RunStatus
from crashproof.runtime.driving.lifecycle import recorded_outcome
from crashproof.runtime.driving.retrying import not_failed
from crashproof.runtime.guards.binding import OperatorChanges, ended_run
from crashproof.runtime.operations.moving import refuse_moved
from crashproof.runtime.workflow import Workflow
from crashproof.store.port import Store

__all__ = ["LedgerResume"]


class LedgerResume:
    """``_to_resume`` of a Ledger."""

    _store: Store
    _workflows: dict[str, Workflow[Any]]

    def journal(self, run_id: str, *, owner: bool = False, results: bool = True) -> list[Event]:
        raise NotImplementedError  # provided by Ledger

    def missing(self, run_id: str) -> CrashproofError:
        raise NotImplementedError  # provided by Ledger

    def _to_resume(
        self, run_id: str, changes: OperatorChanges, *, is_async: bool
    ) -> Workflow[Any] | Callable[[], Any]:
        """The workflow to drive ``run_id`` with, or the answer of a run that needs no
        drive (ended or frozen, its code not registered here)."""
        row = self._store.get_run(run_id)
        if row is None:
            raise self.missing(run_id)  # lost from the journal, when the witness saw it
        if row.status is RunStatus.MOVED:  # before anything else: the run is elsewhere
            refuse_moved(self._store, run_id, self.journal(run_id))
        if changes.retry and row.status is not RunStatus.FAILED:
            raise not_failed(run_id, row.status.value)  # checked again under the lease
        if changes and row.status.terminal and not changes.retry:
            raise ended_run(run_id, row.status.value)
        workflow = self._workflows.get(row.workflow)
        if workflow is None and not changes.retry and (row.status.terminal or row.status.frozen):
            # An ended or frozen run answers from its journal; its code is not needed.
            replay = index_journal(self.journal(run_id))
            finished = recorded_outcome(run_id, replay)
            if finished is not None and not (
                replay.outcome and payloads.outcome(replay.outcome).get("retryable")
            ):
                self._store.sync()  # the outcome leaves again: durable first
                return finished
        if workflow is None:
            known = ", ".join(sorted(self._workflows)) or "none"
            raise UnknownWorkflow(
                f"run {run_id!r} needs workflow {row.workflow!r}, which is not registered "
                f"here (registered: {known}); nothing was changed. Import the module that "
                "defines it (CLI: --app MODULE)."
            )
        workflow.check_shell(is_async)
        return workflow
