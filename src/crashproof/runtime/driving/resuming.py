"""Resuming a run, by either shell: which workflow a resume drives, or the answer of a
run that needs no drive. A mixin of ``Ledger``: ``resume``, ``retry``, ``resume_async``
and the checks a resume makes before it claims the run's lease."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from crashproof.errors import CrashproofError, UnknownWorkflow
from crashproof.journal import payloads
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, RunStatus
from crashproof.runtime.driving.lifecycle import recorded_outcome
from crashproof.runtime.driving.retrying import not_failed
from crashproof.runtime.guards.binding import OperatorChanges, ended_run
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.operations.moving import refuse_moved
from crashproof.runtime.options import RunOptions
from crashproof.runtime.workflow import Workflow
from crashproof.store.port import Store

__all__ = ["LedgerResume"]


class LedgerResume:
    """The resume entry points of a Ledger."""

    _store: Store
    _workflows: dict[str, Workflow[Any]]

    if TYPE_CHECKING:  # provided by Ledger (runtime/drive.py drives the run)

        def _drive(
            self,
            workflow: Workflow[Any],
            run_id: str,
            options: RunOptions | None = None,
            *,
            changes: OperatorChanges | None = None,
            take_over: bool = False,
            wait: float = 0.0,
        ) -> Any: ...

        async def _drive_async(
            self,
            workflow: Workflow[Any],
            run_id: str,
            options: RunOptions | None = None,
            *,
            changes: OperatorChanges | None = None,
            take_over: bool = False,
            wait: float = 0.0,
        ) -> Any: ...

    def resume(
        self,
        run_id: str,
        *,
        raise_budget: dict[str, int | float | None] | None = None,
        rebind_policy: Policy | None = None,
        by: str | None = None,
        take_over: bool = False,
        wait: float = 0.0,
        override_intent: Sequence[str] = (),
        retry: bool = False,
    ) -> Any:
        """Resume a run to completion in this process; returns its result.

        ``raise_budget``: new, higher limits by kind (``{"tokens": 5000}``; None lifts
        one), e.g. to continue a run stopped at a budget. ``rebind_policy``: bind the run
        to another policy (version). ``override_intent``: the runs holding the intent its
        frozen act waits for that the act may pass (runtime/steps/holds.py). ``retry``:
        re-drive a failed run (``retry``). All are journaled as operator decisions: ``by``
        (default: the OS user), host, time, old and new values. A run another worker
        holds raises LeaseHeld unless ``take_over``, which fences that worker out (its
        next journal commit raises StaleLeaseError), or unless it is freed (released or
        expired) within ``wait`` seconds."""
        changes = _changes(raise_budget, rebind_policy, override_intent, retry, by)
        found = self._to_resume(run_id, changes, is_async=False)
        if not isinstance(found, Workflow):
            return found()
        return self._drive(found, run_id, changes=changes, take_over=take_over, wait=wait)

    def retry(
        self, run_id: str, *, by: str | None = None, take_over: bool = False, wait: float = 0.0
    ) -> Any:
        """Re-drive a run recorded ``failed`` under its own id, to completion; returns its
        result. Journaled first (``run_retried``: ``by``, host, time); the failed call is
        attempted again and every other recorded step, decision and act replays, so no
        recorded effect happens twice (runtime/driving/retrying.py). A run that is not
        failed raises ``RetryRefused``, nothing written. Async workflows:
        ``await resume_async(run_id, retry=True, by=...)``."""
        return self.resume(run_id, by=by, take_over=take_over, wait=wait, retry=True)

    async def resume_async(
        self,
        run_id: str,
        *,
        raise_budget: dict[str, int | float | None] | None = None,
        rebind_policy: Policy | None = None,
        by: str | None = None,
        take_over: bool = False,
        wait: float = 0.0,
        override_intent: Sequence[str] = (),
        retry: bool = False,
    ) -> Any:
        """``resume`` for an ``async def`` workflow (a run started by either shell); a
        ``wait`` for the lease is spent in a worker thread, off the loop."""
        changes = _changes(raise_budget, rebind_policy, override_intent, retry, by)
        found = self._to_resume(run_id, changes, is_async=True)
        if not isinstance(found, Workflow):
            return found()
        return await self._drive_async(
            found, run_id, changes=changes, take_over=take_over, wait=wait
        )

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


def _changes(
    raise_budget: dict[str, int | float | None] | None,
    rebind_policy: Policy | None,
    override_intent: Sequence[str],
    retry: bool,
    by: str | None,
) -> OperatorChanges:
    """What a resume changes (``resume``, ``resume_async``), journaled as decisions."""
    return OperatorChanges(
        raise_budget=raise_budget,
        rebind_policy=rebind_policy,
        override_intent=tuple(override_intent),
        retry=retry,
        by=by,
    )
