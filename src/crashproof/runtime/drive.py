"""One drive of a run, by either shell: admit it (the verdict and the lease), own it (the
heartbeat), open it (the Context over its replayed journal), run the workflow's body and
conclude (its outcome recorded, or what stopped it raised). A mixin of ``Ledger``, which
holds the store, the witness and the entry points that call ``_drive``/``_drive_async``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from crashproof.errors import (
    WORKFLOW_OUTCOMES,
    CrashproofError,
    DriveCancelled,
    RunFailed,
    Unverified,
)
from crashproof.journal import payloads
from crashproof.journal.codec import decode, encode, error_record
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, EventType
from crashproof.runtime.async_context import AsyncContext, off_loop
from crashproof.runtime.context import Context
from crashproof.runtime.driving import leases
from crashproof.runtime.driving.batching import StartBatch
from crashproof.runtime.driving.commits import JournalCommits, store_edge, store_failure
from crashproof.runtime.driving.durability import local_commits
from crashproof.runtime.driving.leases import Grant, Heartbeat, stop_driving
from crashproof.runtime.driving.lifecycle import (
    Started,
    StartRecord,
    record_start,
    record_starts,
    recorded_outcome,
    stopped_error,
)
from crashproof.runtime.guards.binding import OperatorChanges, bind_run
from crashproof.runtime.guards.completion import needed, verify
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.operations.audit import session_record
from crashproof.runtime.operations.cancelling import refuse_cancelled
from crashproof.runtime.options import RunOptions
from crashproof.runtime.port import DriveHost
from crashproof.runtime.replayer.verdict import Gate, drive_schema, gate
from crashproof.runtime.steps.handoff import Work, run_async, run_sync
from crashproof.runtime.workflow import Workflow

__all__ = ["LedgerDrive", "Opened"]

log = logging.getLogger("crashproof.runtime.ledger")

# What opening a drive gives: the core Context and the run's input, or the answer of a
# run that has ended (``LedgerDrive._open``).
Opened = tuple[Context, dict[str, Any]] | Callable[[], Any]


class LedgerDrive(JournalCommits, DriveHost):
    """The drives of a Ledger's runs (see the module docstring); they commit through
    ``JournalCommits``."""

    _policies: dict[str, Policy]
    _start_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StartBatch]

    if TYPE_CHECKING:  # provided by Ledger and its other mixins (never shadowed here)

        def _lease_for(self, run_id: str, take_over: bool, wait: float) -> Grant: ...

    def _drive(
        self,
        workflow: Workflow[Any],
        run_id: str,
        options: RunOptions | None = None,
        *,
        changes: OperatorChanges | None = None,
        take_over: bool = False,
        wait: float = 0.0,
        fresh: Started | None = None,
    ) -> Any:
        """Drive the run under its lease (``_owning``), the workflow called in this thread.
        ``fresh``: the start record, when the caller just created the run."""
        verdict, grant, known = self._admit(workflow, run_id, take_over, wait, fresh)
        with self._owning(run_id, grant) as heartbeat, store_edge(run_id):
            opened = self._open(workflow, run_id, options, changes, grant, verdict, known)
            if not isinstance(opened, tuple):
                return opened()
            ctx, input = opened
            heartbeat.drive = ctx  # its outcome's commit releases the lease
            try:
                result = workflow.fn(ctx, **input)
            except Exception as exc:
                self._fail(run_id, ctx, exc)
            return run_sync(self._concluded(workflow, run_id, ctx, result))

    async def _drive_async(
        self,
        workflow: Workflow[Any],
        run_id: str,
        options: RunOptions | None = None,
        *,
        changes: OperatorChanges | None = None,
        take_over: bool = False,
        wait: float = 0.0,
        start: StartRecord | None = None,
    ) -> Any:
        """``_drive`` for an async workflow: the same opening and conclusion, the workflow
        awaited with an ``AsyncContext`` over the same core. ``start``: the run's start,
        to record first (``run_async``)."""
        # The start, the verdict, the claim (or its wait) and the opening read and write
        # the journal: off the loop, in one thread hop (a resume's opening in a second).
        # On a local ledger new runs start on the loop's thread, the starts of a turn in
        # one transaction (StartBatch), as its quick commits are (runtime/driving/
        # batching.py: a thread would wait for the GIL at each statement while the loop
        # is busy); an existing run's verdict reads its journal, in a thread.
        fresh: Started | None = None
        if start is not None and local_commits(self.url, self.durability):
            fresh = await self._starting().submit(start)
            start = None  # recorded
        how = (run_id, options, changes, take_over, wait)
        if fresh is not None:
            verdict, grant, known, opened = self._admitted(workflow, None, fresh, *how)
        else:
            verdict, grant, known, opened = await off_loop(
                self._admitted, workflow, start, None, *how
            )
        heartbeat: Heartbeat | None = None
        try:
            with self._owning(run_id, grant, leases.TaskHeartbeat) as heartbeat, store_edge(run_id):
                if opened is None:
                    opened = await off_loop(
                        self._open, workflow, run_id, options, changes, grant, verdict, known
                    )
                if isinstance(opened, tuple):
                    heartbeat.drive = opened[0]  # its outcome's commit releases the lease
                return await self._drive_owned_async(run_id, workflow, opened)
        finally:  # the lease is free when the drive returns
            released = getattr(heartbeat, "released", None)
            if released is not None:
                await released

    def _starting(self) -> StartBatch:
        """The batch of this loop's new runs (``_drive_async``)."""
        loop = asyncio.get_running_loop()
        found = self._start_batches.get(loop)
        if found is None:
            found = self._start_batches[loop] = StartBatch(
                loop, functools.partial(record_starts, self, owner=self.worker_id), _abandoned
            )
        return found

    async def _drive_owned_async(self, run_id: str, workflow: Workflow[Any], opened: Opened) -> Any:
        if not isinstance(opened, tuple):
            return opened()
        core, input = opened
        ctx = AsyncContext(core)
        try:
            try:
                result = await workflow.fn(ctx, **input)
            except Exception as exc:
                if ctx.cancelled_at is not None:  # whatever the workflow made of it
                    raise DriveCancelled(run_id, ctx.cancelled_at) from exc
                self._fail(run_id, core, exc)
            finally:
                ctx.end()
            if ctx.cancelled_at is not None:  # the workflow swallowed the cancellation
                raise DriveCancelled(run_id, ctx.cancelled_at)
            value = await run_async(self._concluded(workflow, run_id, core, result), ctx.settle)
        except Exception:
            await ctx.settle()  # what the caller learns leaves the process: committed first
            raise
        await ctx.settle()
        return value

    def _admitted(
        self,
        workflow: Workflow[Any],
        start: StartRecord | None,
        fresh: Started | None,
        run_id: str,
        options: RunOptions | None,
        changes: OperatorChanges | None,
        take_over: bool,
        wait: float,
    ) -> tuple[Gate, Grant, list[Event] | None, Opened | None]:
        """An async drive's start (``start``: to record; ``fresh``: recorded), verdict and
        lease; and, for a run this drive just created, its opening too, which reads
        nothing (a resume's journal read waits for its heartbeat: ``_drive_async``)."""
        if start is not None:
            fresh = record_start(self, start, self.worker_id)
        verdict, grant, known = self._admit(workflow, run_id, take_over, wait, fresh)
        if known is None:
            return verdict, grant, known, None
        try:
            opened = self._open(workflow, run_id, options, changes, grant, verdict, known)
        except BaseException as exc:  # as _owning would: a crash leaves the lease
            stop_driving(grant.lease.owner, run_id)
            self.drive_ended(run_id, grant.lease.token)
            if isinstance(exc, Exception):
                leases.release(self._store, run_id, grant.lease)
            raise
        return verdict, grant, known, opened

    def _admit(
        self,
        workflow: Workflow[Any],
        run_id: str,
        take_over: bool,
        wait: float,
        fresh: Started | None,
    ) -> tuple[Gate, Grant, list[Event] | None]:
        """The drive's verdict and lease, and its journal when known without a read: a run
        this drive created (``fresh``, its start record) whose lease it was the first to
        claim (fencing token 1). Every writer of a journal holds a lease, so no one wrote
        after the start, and no version changed since it: no verdict to compute."""
        if fresh is not None:
            start, lease = fresh  # the run created held by this drive, or claimed now
            grant = Grant(lease) if lease else self._lease_for(run_id, take_over, wait)
            if grant.lease.token == 1:
                return Gate(drive_schema(self)), grant, [start]
            stop_driving(grant.lease.owner, run_id)  # another drive came between: the
            leases.release(self._store, run_id, grant.lease)  # verdict comes first
        verdict = gate(self, workflow, run_id)  # before the lease (runtime/replayer/verdict.py)
        return verdict, self._lease_for(run_id, take_over, wait), None  # or the queue's claim

    @contextlib.contextmanager
    def _owning(
        self, run_id: str, grant: Grant, beat: type[Heartbeat] = Heartbeat
    ) -> Iterator[Heartbeat]:
        """Renew the run's lease while the drive runs, then release it. A crash
        (SimulatedCrash, or any BaseException that is not an Exception) leaves the lease
        to expire, as a dead process would; so does a cancelled async drive, whose
        cancelled call may still run in a worker thread."""
        lease = grant.lease
        heartbeat = beat(self._store, run_id, lease, lambda: self._stale.add((run_id, lease.token)))
        try:
            yield heartbeat
        except DriveCancelled:
            heartbeat.stop()
            raise
        except Exception:
            heartbeat.stop()
            heartbeat.release()
            raise
        except BaseException:
            heartbeat.stop()
            raise
        finally:
            stop_driving(lease.owner, run_id)
            self.drive_ended(run_id, lease.token)
        heartbeat.stop()
        heartbeat.release()

    def _open(
        self,
        workflow: Workflow[Any],
        run_id: str,
        options: RunOptions | None,
        changes: OperatorChanges | None,
        grant: Grant,
        verdict: Gate,
        known: list[Event] | None = None,
    ) -> Opened:
        """The core Context for this drive and the run's input; or, for a run that has
        ended, the answer it ended with. ``known``: the journal, when ``_admit`` knew it."""
        token = grant.lease.token
        if known is None:
            events = self.journal(run_id, owner=True)
        else:  # rolled forward past the start record as journal(owner=True) would
            events = known
            if self._witness is not None and self.durability != "output":
                self._witness.advance(run_id, len(known))
        replay = index_journal(events)
        refuse_cancelled(run_id, replay)  # under the lease, before anything is written
        if replay.undelivered:  # delivered again below: durable first (a crash may have
            self._store.sync()  # left them unsynced)
        workflow.check_resumes(run_id, str(payloads.run_started(replay.started).get("version")))
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
        verdict.record(ctx, ctx.session)  # the schema in the session; a resumable verdict first
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
            finished = recorded_outcome(run_id, replay)
            if finished is not None:
                self._store.sync()  # the outcome leaves again: durable first
                return finished
        return ctx, dict(replay.started.value or {})

    def _fail(self, run_id: str, ctx: Context, exc: Exception) -> NoReturn:
        """The workflow raised ``exc``: record the run's failure, or raise what stopped it."""
        if ctx.broken is not None:  # whatever the workflow made of the ledger's failure
            raise store_failure(run_id, ctx.broken) from exc
        if ctx.frozen is not None:
            raise stopped_error(run_id, ctx.frozen, ctx.frozen_evidence) from exc
        if isinstance(exc, CrashproofError) and not isinstance(exc, WORKFLOW_OUTCOMES):
            raise exc  # the ledger, not the workflow, is at fault: keep the run resumable
        self._refuse_unreplayed(run_id, ctx, "raised")
        error = error_record(exc)
        ctx.finish(EventType.RUN_FAILED, payloads.as_dict(payloads.RunFailed(error=error)), None)
        raise RunFailed(run_id, error, exc) from exc

    def _concluded(
        self, workflow: Workflow[Any], run_id: str, ctx: Context, result: Any
    ) -> Work[Any]:
        """The workflow returned ``result``: record the run's success (after the receipt
        re-read when nothing ran live, and with the completion evidence it requires), or
        raise what stopped it."""
        if ctx.frozen is not None:
            raise stopped_error(run_id, ctx.frozen, ctx.frozen_evidence)
        self._refuse_unreplayed(run_id, ctx, "returned")
        if ctx.reread.pending:  # nothing ran live: the receipts are re-read before the outcome
            try:
                yield from ctx.reread.check(ctx)
            except CrashproofError:
                raise stopped_error(run_id, ctx.frozen, ctx.frozen_evidence) from None
        value_json = encode(result, what=f"the result of run {run_id!r}")
        succeeded = payloads.RunSucceeded()
        completion = needed(workflow.completion, ctx.policy.completion if ctx.policy else None)
        if completion is not None:
            try:
                succeeded["completion"] = yield from verify(ctx, completion, ctx.handed.values())
            except Unverified:
                raise stopped_error(run_id, ctx.frozen, ctx.frozen_evidence) from None
        ctx.finish(EventType.RUN_SUCCEEDED, payloads.as_dict(succeeded), value_json)
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
            raise stopped_error(run_id, ctx.frozen, ctx.frozen_evidence) from None


def _abandoned(started: Started | Exception | None) -> None:
    """A new run whose drive was cancelled while its start was recorded: no longer driven
    here (its lease in the store expires, as a crashed drive's)."""
    if isinstance(started, tuple) and started[1] is not None:
        stop_driving(started[1].owner, started[0].run_id)
