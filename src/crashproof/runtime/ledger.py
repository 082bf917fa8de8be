"""The Ledger: a durable store plus the runtime that drives workflows over it."""

from __future__ import annotations

import functools
import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from crashproof._faults import CrashPoints
from crashproof.errors import (
    ActFailed,
    ApprovalRequired,
    CrashproofError,
    NonDeterminismError,
    PermanentError,
    RetryableError,
    RunConflict,
    RunFailed,
    RunFrozen,
    RunStopped,
    StaleLeaseError,
    UnknownWorkflow,
)
from crashproof.integrity.keys import Keyring, resolve_keyring
from crashproof.integrity.seal import Sealer
from crashproof.integrity.witness import Witness, compare
from crashproof.journal import payloads
from crashproof.journal.codec import (
    canonical_digest,
    decode,
    encode,
    error_from_record,
    error_record,
)
from crashproof.journal.fold import Replay, fold_run, index_journal
from crashproof.journal.records import Event, EventType, RunInfo, RunRow, RunStatus
from crashproof.runtime.context import Context
from crashproof.runtime.driving.durability import output_point, share_witness_writes
from crashproof.runtime.driving.leases import HOST, Grant, Heartbeat, release, stop_driving
from crashproof.runtime.driving.queue import Draining, LedgerQueue
from crashproof.runtime.driving.urls import (
    DURABILITY_MODES,
    default_witness,
    open_store,
    without_password,
)
from crashproof.runtime.guards.approvers import reserved
from crashproof.runtime.guards.binding import OperatorChanges, bind_run, ended_run, start_fields
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.operations.audit import session_record, started_by
from crashproof.runtime.operations.maintenance import LedgerCare
from crashproof.runtime.operations.moving import refuse_moved
from crashproof.runtime.operations.oversight import LedgerHumans
from crashproof.runtime.options import RunOptions
from crashproof.runtime.port import ActSettings, DriveHost
from crashproof.runtime.workflow import Workflow, make_workflow
from crashproof.store.port import StatusChange, Store

# DURABILITY_MODES and open_store live in runtime.driving.urls; re-exported for callers.
__all__ = ["DURABILITY_MODES", "Ledger", "open_store"]

log = logging.getLogger(__name__)

R = TypeVar("R")


# CrashproofErrors a workflow may legitimately end with (a tool's permanent failure).
# Any other CrashproofError escaping the workflow (a corrupt ledger, a non-JSON value,
# a lost lease) is never recorded as the run's failure: the run stays resumable once
# the cause is fixed.
_WORKFLOW_OUTCOMES = (ActFailed, PermanentError, RetryableError)


class Ledger(LedgerCare, LedgerHumans, LedgerQueue, DriveHost):
    """Durable runs of workflows. Independent instances never share state.

    Implements the ``DriveHost`` port (``runtime/port.py``) for its Context and its
    operations: every member of that port is defined here, in this class's own body.

    >>> ledger = Ledger("sqlite:///runs.db")  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str = "sqlite:///crashproof.db",
        *,
        durability: str = "output",
        store: Store | None = None,
        crash_points: CrashPoints | None = None,
        act_settings: ActSettings | None = None,
        key: bytes | str | Keyring | None = None,
        witness: Witness | None = None,
        lease_seconds: float = 15.0,
    ) -> None:
        """``durability``: "output" (the default: commits are forced to disk only right
        before something leaves the process, see runtime/driving/durability.py), "full" or "normal".
        ``key``: the journal key or keyring (default: ``CRASHPROOF_KEY``,
        ``CRASHPROOF_KEY_FILE``, else a key file generated once in the user's config
        directory); ``witness``: where generations are mirrored (default: a file beside
        a SQLite ledger; none for ``memory://`` or a ``store=`` given without one);
        ``lease_seconds``: how long a run's lease lasts without renewal (renewed every
        third of it while this Ledger drives the run)."""
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be positive, not {lease_seconds!r}")
        self.lease_seconds = float(lease_seconds)
        # Who holds the leases this Ledger takes: host, process and a per-Ledger nonce.
        self.worker_id = f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stale: set[tuple[str, int]] = set()  # (run id, token) whose lease was lost
        self._claimed = {}  # driving/queue.py: claimed from the queue, not yet driven
        # Set by a worker that stops: every run this Ledger drives stops at its next step.
        self.draining = False
        self.url = url
        self.shown_url = without_password(url)  # what messages and logs may show
        self.durability = durability
        if store is None:
            durable = url.startswith(("sqlite:///", "postgresql://", "postgres://"))
            sealer = Sealer(resolve_keyring(key)) if durable else None
            store = open_store(url, durability=durability, sealer=sealer)
            try:
                witness = witness or default_witness(url, store)
            except BaseException:
                store.close()
                raise
        self._store = store
        self._witness = witness
        share_witness_writes(store, witness)  # one witness write per group sync
        self._workflows: dict[str, Workflow[Any]] = {}
        self._policies: dict[str, Policy] = {}  # by version: runs find theirs on resume
        self.crash_points = crash_points
        self.act_settings = act_settings or ActSettings()

    # -- registry ----------------------------------------------------------

    def workflow(
        self, name: str, version: str = "1", *, compatible_with: Sequence[str] = ()
    ) -> Callable[[Callable[..., R]], Workflow[R]]:
        """Decorator: register ``fn(ctx, **input)`` under ``name`` and ``version``;
        ``compatible_with`` lists older versions whose in-flight runs it can finish."""

        def wrap(fn: Callable[..., R]) -> Workflow[R]:
            return self.register(make_workflow(name, version, fn, compatible_with))

        return wrap

    def register(self, wf: Workflow[R]) -> Workflow[R]:
        """Register a workflow made elsewhere (e.g. with ``cp.workflow``)."""
        known = self._workflows.get(wf.name)
        if known is not None and known is not wf and known.version != wf.version:
            raise CrashproofError(
                f"workflow {wf.name!r} is already registered with version {known.version!r}"
            )
        self._workflows[wf.name] = wf
        return wf

    @property
    def workflows(self) -> dict[str, Workflow[Any]]:
        return dict(self._workflows)

    def register_policy(self, policy: Policy) -> Policy:
        """Make ``policy`` available to runs bound to its version (resumes find the policy
        a run recorded here). One content per version: changed rules need a new version."""
        if not isinstance(policy, Policy):
            raise TypeError(f"register_policy expects a cp.Policy, not {type(policy).__name__}")
        known = self._policies.get(policy.version)
        if known is not None and known.digest != policy.digest:
            raise CrashproofError(
                f"policy version {policy.version!r} is already registered with other rules "
                f"(digest {known.digest}, now {policy.digest}); give changed rules a new version"
            )
        self._policies[policy.version] = policy
        return policy

    @property
    def policies(self) -> dict[str, Policy]:
        return dict(self._policies)

    # -- running -----------------------------------------------------------

    def run(
        self,
        wf: Workflow[R] | str,
        /,
        *,
        run_id: str,
        options: RunOptions | None = None,
        **input: Any,
    ) -> R:
        """Start the run ``run_id`` or, if it exists with the same input, resume it to
        completion; returns the workflow's result. The same run id with another input
        raises RunConflict and starts nothing. ``options``: the run's ``cp.Limits`` and
        ``cp.Policy``, recorded at start (a budget reached raises RunStopped)."""
        workflow = self._record(wf, run_id, options, input)
        return self._drive(workflow, run_id, options)  # type: ignore[no-any-return]

    def _record(
        self, wf: Workflow[R] | str, run_id: str, options: RunOptions | None, input: Any
    ) -> Workflow[R]:
        """Record the run's start unless it exists with the same input (else RunConflict)."""
        workflow = self._resolve(wf)
        options_record = start_fields(options)
        if options is not None and options.policy is not None:
            self.register_policy(options.policy)
        if not isinstance(run_id, str) or not run_id or reserved(run_id):
            raise ValueError("run_id must be a non-empty string, not under 'crashproof:'")
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
                **options_record,
                "started_by": started_by(self.worker_id),
            },
            value_json=input_json,
            created_at=now,
        )
        new = self._store.get_run(run_id) is None
        if new and self._witness is not None:
            if self._witness.get(run_id):  # lost from the journal: never a second start
                raise self.missing(run_id)
            self._witness.start(run_id)  # generation 0, before the run's first commit
        if new:  # resuming an existing run commits nothing here: no crash point
            self._hit("before_commit", first)
        existing = self._store.create_run(row, first)
        if existing is None:
            self._hit("after_commit", first)
            log.info("run started", extra={"run_id": run_id, "workflow": workflow.name})
        elif existing.input_digest != digest:
            raise RunConflict(run_id, existing.input_digest, digest)
        return workflow

    def resume(
        self,
        run_id: str,
        *,
        raise_budget: dict[str, int | float | None] | None = None,
        rebind_policy: Policy | None = None,
        by: str | None = None,
        take_over: bool = False,
        wait: float = 0.0,
    ) -> Any:
        """Resume a run to completion in this process; returns its result.

        ``raise_budget``: new, higher limits by kind (``{"tokens": 5000}``; None lifts
        one), e.g. to continue a run stopped at a budget. ``rebind_policy``: bind the run
        to another policy (version). Both are journaled as operator decisions: ``by``
        (default: the OS user), host, time, old and new values. A run another worker
        holds raises LeaseHeld unless ``take_over``, which fences that worker out (its
        next journal commit raises StaleLeaseError), or unless it is freed (released or
        expired) within ``wait`` seconds."""
        changes = OperatorChanges(raise_budget=raise_budget, rebind_policy=rebind_policy, by=by)
        row = self._store.get_run(run_id)
        if row is None:
            raise self.missing(run_id)  # lost from the journal, when the witness saw it
        if row.status is RunStatus.MOVED:  # before anything else: the run is elsewhere
            refuse_moved(self._store, run_id, self.journal(run_id))
        if changes and row.status.terminal:
            raise ended_run(run_id, row.status.value)
        workflow = self._workflows.get(row.workflow)
        if workflow is None and (row.status.terminal or row.status.frozen):
            # An ended or frozen run answers from its journal; its code is not needed.
            replay = index_journal(self.journal(run_id))
            finished = _outcome(run_id, replay)
            if finished is not None and not (
                replay.outcome and payloads.outcome(replay.outcome).get("retryable")
            ):
                self._store.sync()  # the outcome leaves again: durable first
                return finished()
        if workflow is None:
            known = ", ".join(sorted(self._workflows)) or "none"
            raise UnknownWorkflow(
                f"run {run_id!r} needs workflow {row.workflow!r}, which is not registered "
                f"here (registered: {known}); nothing was changed. Import the module that "
                "defines it (CLI: --app MODULE)."
            )
        return self._drive(workflow, run_id, changes=changes, take_over=take_over, wait=wait)

    def get_run(self, run_id: str) -> RunInfo:
        """Everything known about a run, folded from its journal."""
        row = self._store.get_run(run_id)
        if row is None:
            raise self.missing(run_id)
        return fold_run(row, self.journal(run_id))

    def runs(self, status: RunStatus | str | None = None) -> list[RunInfo]:
        """All runs, oldest first, optionally only those of one status."""
        wanted = RunStatus(status) if status is not None else None
        rows = [row for row in self._store.list_runs() if not reserved(row.run_id)]
        infos = [fold_run(row, self.journal(row.run_id)) for row in rows]
        # Filtered on the status folded from each journal, not on the index row's cache.
        return [info for info in infos if wanted is None or info.status is wanted]

    def close(self) -> None:
        self._store.close()
        if self._witness is not None:
            self._witness.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------

    def _resolve(self, wf: Workflow[R] | str) -> Workflow[R]:
        if isinstance(wf, str):
            found = self._workflows.get(wf)
            if found is None:
                raise UnknownWorkflow(f"no workflow {wf!r} is registered in this ledger")
            return found
        if not isinstance(wf, Workflow):
            raise TypeError(
                "Ledger.run expects a workflow made with @ledger.workflow or @cp.workflow, "
                f"not {type(wf).__name__}"
            )
        return self.register(wf)

    def _drive(
        self,
        workflow: Workflow[Any],
        run_id: str,
        options: RunOptions | None = None,
        *,
        changes: OperatorChanges | None = None,
        take_over: bool = False,
        wait: float = 0.0,
    ) -> Any:
        """Claim the run's lease, drive the run under it, release it. A crash
        (SimulatedCrash, or any BaseException that is not an Exception) leaves the lease
        to expire, as a dead process would."""
        grant = self._lease_for(run_id, take_over, wait)  # a new claim, or the queue's
        lease = grant.lease
        heartbeat = Heartbeat(
            self._store, run_id, lease, lambda: self._stale.add((run_id, lease.token))
        )
        try:
            result = self._drive_owned(workflow, run_id, options, changes, grant)
        except Exception:
            heartbeat.stop()
            release(self._store, run_id, heartbeat.lease)
            raise
        except BaseException:
            heartbeat.stop()
            raise
        finally:
            stop_driving(lease.owner, run_id)
            self._stale.discard((run_id, lease.token))
        heartbeat.stop()
        release(self._store, run_id, heartbeat.lease)
        return result

    def _drive_owned(
        self,
        workflow: Workflow[Any],
        run_id: str,
        options: RunOptions | None,
        changes: OperatorChanges | None,
        grant: Grant,
    ) -> Any:
        token = grant.lease.token
        events = self.journal(run_id, owner=True)
        replay = index_journal(events)
        if replay.undelivered:  # delivered again below: durable first (a crash may have
            self._store.sync()  # left them unsynced)
        started = payloads.run_started(replay.started)
        if not workflow.can_resume(str(started.get("version"))):
            raise UnknownWorkflow(
                f"run {run_id!r} started on workflow {workflow.name!r} version "
                f"{started.get('version')!r}, but this process registers version "
                f"{workflow.version!r} (compatible with {list(workflow.compatible_with)}); "
                "nothing was changed. Deploy a worker that still registers the old version "
                "to finish it, or declare compatible_with=[...] if this code replays it."
            )
        replay, policy = bind_run(
            run_id,
            events,
            replay,
            options=options,
            changes=changes,
            policies=self._policies,
            commit=functools.partial(self.append_records, fencing_token=token),
        )
        ctx = Context(self, run_id, replay)
        ctx.fencing_token = token
        ctx.policy = policy
        # The drive's first record names its session and the lease it runs under.
        ctx.session = session_record(self.worker_id, workflow, policy, grant.receipt(run_id))
        ctx.versions = {"workflow": workflow.version, "policy": policy.version if policy else None}
        outcome = replay.outcome
        if outcome is not None and (
            outcome.type is EventType.RUN_STOPPED  # bind_run found the budget raised
            or (
                outcome.type is EventType.RUN_FROZEN
                and payloads.run_frozen(outcome).get("retryable")
            )
        ):
            ctx.thaw()  # e.g. a lookup was unavailable: this resume looks again
        else:
            finished = _outcome(run_id, replay)
            if finished is not None:
                self._store.sync()  # the outcome leaves again: durable first
                return finished()
        try:
            result = workflow.fn(ctx, **(replay.started.value or {}))
        except Exception as exc:
            if ctx.frozen is not None:
                raise self._frozen(run_id, ctx) from exc
            if isinstance(exc, CrashproofError) and not isinstance(exc, _WORKFLOW_OUTCOMES):
                raise  # the ledger, not the workflow, is at fault: keep the run resumable
            self._refuse_unreplayed(run_id, ctx, "raised")
            error = error_record(exc)
            ctx.finish(
                EventType.RUN_FAILED, payloads.as_dict(payloads.RunFailed(error=error)), None
            )
            raise RunFailed(run_id, error, exc) from exc
        if ctx.frozen is not None:
            raise self._frozen(run_id, ctx)
        self._refuse_unreplayed(run_id, ctx, "returned")
        if ctx.reread.pending:  # nothing ran live: the receipts are re-read before the outcome
            try:
                ctx.reread.check(ctx)
            except CrashproofError:
                raise self._frozen(run_id, ctx) from None
        value_json = encode(result, what=f"the result of run {run_id!r}")
        ctx.finish(EventType.RUN_SUCCEEDED, payloads.as_dict(payloads.RunSucceeded()), value_json)
        log.info("run succeeded", extra={"run_id": run_id})
        return decode(value_json)

    def _refuse_unreplayed(self, run_id: str, ctx: Context, ended: str) -> None:
        """A workflow that ends (returns or raises) while recorded steps remain unreplayed
        no longer matches its journal: freeze, never record an outcome the history
        contradicts."""
        left = ctx.unreplayed()
        if not left:
            return
        try:
            ctx.freeze(
                f"non-determinism: the workflow {ended} while {len(left)} recorded "
                f"step(s) were not replayed, first {left[0].key!r}",
                {"unreplayed": [e.key for e in left[:20]]},
            )
        except CrashproofError:
            raise self._frozen(run_id, ctx) from None

    def _frozen(self, run_id: str, ctx: Context) -> CrashproofError:
        cause = ctx.frozen
        if isinstance(cause, RunFailed):  # a reviewer's abort, journaled (runtime/guards/review.py)
            return cause
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
        return RunFrozen(run_id, status.value, str(cause), cause, evidence=ctx.frozen_evidence)

    # -- the DriveHost port ---------------------------------------------------

    @property
    def store(self) -> Store:
        return self._store

    @property
    def witness(self) -> Witness | None:
        return self._witness

    def check_driving(self, run_id: str) -> None:
        """Called by the Context before each step, decision or act starts."""
        if self.draining:
            raise Draining(
                f"run {run_id!r}: this worker is stopping; the run stops before its next "
                "step and stays resumable (its lease is released for another worker)"
            )

    def append_records(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        *,
        fencing_token: int | None = None,
        output: bool | None = None,
    ) -> None:
        """Append to the journal, with crash points on each side of the commit; at an
        output point (runtime/driving/durability.py) the commit is forced to disk first, then the
        new generation is mirrored in the witness (a crash in between is caught up by
        the next resume). ``fencing_token``: the lease the run is driven under; the
        store checks it in the commit's transaction (StaleLeaseError, nothing kept).
        ``output``: whether the last record is an output point, when the caller knows
        (None: output_point decides)."""
        if self._stale and (events[0].run_id, fencing_token) in self._stale:
            raise StaleLeaseError(
                f"run {events[0].run_id!r}: this worker's lease (fencing token "
                f"{fencing_token}) was lost to another worker; nothing more is written"
            )
        if self.crash_points is not None:
            self._hit("before_commit", events[0])
        # Something leaves the process next?
        durable = output_point(events[-1]) if output is None else output
        self._store.append(events, status, fencing_token=fencing_token, durable=durable)
        if self.crash_points is not None:
            self._hit("after_commit", events[0])
        if self._witness is not None and durable:
            self._witness.advance(events[0].run_id, events[-1].seq + 1)

    def journal(self, run_id: str, *, owner: bool = False) -> list[Event]:
        """A run's journal, every record's MAC and the chain verified by the store, and
        its generation checked against the witness. ``owner``: the caller is about to
        drive the run, so a journal ahead of its witness rolls the witness forward."""
        witness = self._witness
        # Witness first: writers advance it after their commit, so a reader racing a live
        # run (another worker) never sees the journal behind it.
        witnessed = None if witness is None else witness.get(run_id)
        events = self._store.load_events(run_id)
        ahead = witness is not None and compare(run_id, len(events), witnessed)
        # "output": the witness advances only after an output point's sync, never ahead
        # of what a power cut leaves (records past it may still be unsynced).
        if witness is not None and ahead and owner and self.durability != "output":
            witness.advance(run_id, len(events))
        if owner:  # a run exported as a move is driven where it was imported, not here
            refuse_moved(self._store, run_id, events)
        return events

    def _hit(self, side: str, event: Event) -> None:
        points = self.crash_points
        if points is not None:
            label = event.type.value if event.key is None else f"{event.type.value}:{event.key}"
            points.hit(f"{side}[{label}]")


def _outcome(run_id: str, replay: Replay) -> Callable[[], Any] | None:
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
