"""The Ledger: a durable store plus the runtime that drives workflows over it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import secrets
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

from crashproof._faults import CrashPoints
from crashproof.errors import (
    ActFailed,
    CrashproofError,
    DriveCancelled,
    PermanentError,
    RetryableError,
    RunFailed,
    UnknownWorkflow,
    Unverified,
)
from crashproof.integrity.external import SealedState
from crashproof.integrity.keys import Keyring, resolve_keyring
from crashproof.integrity.seal import Sealer
from crashproof.integrity.witness import Witness, compare
from crashproof.journal import payloads
from crashproof.journal.codec import decode, encode, error_record
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, EventType
from crashproof.runtime.async_context import AsyncContext, off_loop
from crashproof.runtime.context import Context
from crashproof.runtime.driving import leases
from crashproof.runtime.driving.batching import StartBatch
from crashproof.runtime.driving.commits import JournalCommits, store_edge, store_failure
from crashproof.runtime.driving.durability import local_commits, share_witness_writes
from crashproof.runtime.driving.leases import HOST, Grant, Heartbeat, stop_driving
from crashproof.runtime.driving.lifecycle import (
    Started,
    StartRecord,
    record_start,
    record_starts,
    recorded_outcome,
    start_record,
    stopped_error,
)
from crashproof.runtime.driving.queue import Draining, LedgerQueue
from crashproof.runtime.driving.urls import (
    DURABILITY_MODES,
    default_witness,
    open_store,
    without_password,
)
from crashproof.runtime.guards.approvers import reserved
from crashproof.runtime.guards.binding import OperatorChanges, bind_run, start_fields
from crashproof.runtime.guards.completion import needed, verify
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.operations.audit import session_record, started_by
from crashproof.runtime.operations.cancelling import LedgerCancel, refuse_cancelled
from crashproof.runtime.operations.maintenance import LedgerCare
from crashproof.runtime.operations.moving import refuse_moved
from crashproof.runtime.operations.oversight import LedgerHumans
from crashproof.runtime.options import RunOptions
from crashproof.runtime.port import ActSettings
from crashproof.runtime.replayer.verdict import Gate, drive_schema, gate
from crashproof.runtime.steps.handoff import Work, run_async, run_sync
from crashproof.runtime.workflow import Registry, Workflow
from crashproof.store.port import Store

# DURABILITY_MODES and open_store live in runtime.driving.urls; re-exported for callers.
__all__ = ["DURABILITY_MODES", "Ledger", "open_store"]

log = logging.getLogger(__name__)

R = TypeVar("R")


# CrashproofErrors a workflow may legitimately end with (a tool's permanent failure).
# Any other CrashproofError escaping the workflow (a corrupt ledger, a non-JSON value,
# a lost lease) is never recorded as the run's failure: the run stays resumable once
# the cause is fixed.
_WORKFLOW_OUTCOMES = (ActFailed, PermanentError, RetryableError)
# What opening a drive gives: the core Context and the run's input, or the answer of a
# run that has ended (``Ledger._open``).
Opened = tuple[Context, dict[str, Any]] | Callable[[], Any]


class Ledger(Registry, JournalCommits, LedgerCare, LedgerHumans, LedgerCancel, LedgerQueue):
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
        clock: Callable[[], float] | None = None,
        store_requests: bool = False,
    ) -> None:
        """``durability``: "output" (default: a commit is forced to disk only before
        something leaves the process; driving/durability.py), "full" or "normal". ``key``:
        else integrity/keys.py's order (no key: ``KeyUnusable``). ``witness``: where
        generations are mirrored (a file beside a SQLite ledger by default). ``lease_seconds``:
        a lease's life unrenewed (renewed every third of it). ``clock``: this host's clock,
        a testing hook (Store.now reads it on SQLite). ``store_requests=True``: a model
        call's request is stored for people to read; else bound by its digest only."""
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be positive, not {lease_seconds!r}")
        self.lease_seconds = float(lease_seconds)
        # Who holds the leases this Ledger takes: host, process and a per-Ledger nonce.
        self.worker_id = f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stale: set[tuple[str, int]] = set()  # (run id, token) whose lease was lost
        self._broken = {}  # (run id, token) a commit of which failed (driving/commits.py)
        self._start_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StartBatch]
        self._start_batches = weakref.WeakKeyDictionary()  # per loop (_drive_async)
        self._claimed = {}  # driving/queue.py: claimed from the queue, not yet driven
        # Set by a worker that stops: every run this Ledger drives stops at its next step.
        self.draining = False
        self.url, self.durability = url, durability
        self.shown_url = without_password(url)  # what messages and logs may show
        self._key = key  # resolved again by sealed_state (never kept in a field we print)
        if store is None:
            durable = url.startswith(("sqlite:///", "postgresql://", "postgres://"))
            sealer = Sealer(resolve_keyring(key)) if durable else None
            store = open_store(url, durability=durability, sealer=sealer)
            try:
                witness = witness or default_witness(url, store)
            except BaseException:
                store.close()
                raise
        store.clock.clock = clock or store.clock.clock
        self._store, self._witness = store, witness
        share_witness_writes(store, witness)  # one witness write per group sync
        self._workflows: dict[str, Workflow[Any]] = {}
        self._policies: dict[str, Policy] = {}  # by version: runs find theirs on resume
        self.crash_points, self.act_settings = crash_points, act_settings or ActSettings()
        self.store_requests = store_requests  # runtime/operations/requests.py

    # -- running (the sync entry points; the async ones follow) -----------

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
        workflow, fresh = self._record(wf, run_id, options, input, is_async=False)
        return self._drive(workflow, run_id, options, fresh=fresh)  # type: ignore[no-any-return]

    async def run_async(
        self,
        wf: Workflow[R] | str,
        /,
        *,
        run_id: str,
        options: RunOptions | None = None,
        **input: Any,
    ) -> R:
        """``run`` for an ``async def`` workflow: the same journal, records and guarantees;
        its ctx calls are awaited (``AsyncContext``). Its journal I/O waits off the loop
        (``AsyncContext.settle``, ``off_loop``)."""
        workflow, start = self._start_of(wf, run_id, options, input, is_async=True)
        return await self._drive_async(workflow, run_id, options, start=start)  # type: ignore[no-any-return]

    def _record(
        self,
        wf: Workflow[R] | str,
        run_id: str,
        options: RunOptions | None,
        input: dict[str, Any],
        *,
        is_async: bool | None = None,
    ) -> tuple[Workflow[R], Started | None]:
        """Record the run's start unless it exists with the same input (else RunConflict);
        the start record too when this call created the run. ``is_async``: the shell that
        drives it next (None: a worker, either), which holds the new run from its start."""
        workflow, start = self._start_of(wf, run_id, options, input, is_async=is_async)
        owner = None if is_async is None else self.worker_id
        return workflow, record_start(self, start, owner)

    def _start_of(
        self,
        wf: Workflow[R] | str,
        run_id: str,
        options: RunOptions | None,
        input: dict[str, Any],
        *,
        is_async: bool | None,
    ) -> tuple[Workflow[R], StartRecord]:
        """The workflow and the start record of a run (nothing written): bad input is
        refused here."""
        workflow = self._resolve(wf)
        if is_async is not None:
            workflow.check_shell(is_async)
        fields = start_fields(options)
        if options is not None and options.policy is not None:
            self.register_policy(options.policy)
        if not isinstance(run_id, str) or not run_id or reserved(run_id):
            raise ValueError("run_id must be a non-empty string, not under 'crashproof:'")
        fields["started_by"] = started_by(self.worker_id)
        return workflow, start_record(workflow, run_id, input, fields)

    def sealed_state(self, namespace: str, *, witness: Witness | None = None) -> SealedState:
        """HMAC seals under this ledger's keyring and a generation witness, for state an
        integration keeps in its own tables (crashproof/integrity/external.py). The
        witness: ``witness``, else one of its own beside the ledger's (a SQLite file
        ``<db>.<namespace>.witness``, a PostgreSQL schema ``<schema>_<namespace>_witness``),
        else none for ``memory://``. The caller closes it."""
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", namespace):
            raise ValueError(f"namespace must be a short lower-case identifier, not {namespace!r}")
        if witness is None:
            witness = default_witness(self.url, self._store, namespace)
        return SealedState(namespace, resolve_keyring(self._key), witness)

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
        if isinstance(exc, CrashproofError) and not isinstance(exc, _WORKFLOW_OUTCOMES):
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

    def journal(self, run_id: str, *, owner: bool = False, results: bool = True) -> list[Event]:
        """A run's journal, every record's MAC and the chain verified by the store, and
        its generation checked against the witness. ``owner``: the caller is about to
        drive the run, so a journal ahead of its witness rolls the witness forward.
        ``results=False``: without the steps' results (``Store.load_events``)."""
        witness = self._witness
        # Witness first: writers advance it after their commit, so a reader racing a live
        # run (another worker) never sees the journal behind it.
        witnessed = None if witness is None else witness.get(run_id)
        events = self._store.load_events(run_id, results=results)
        ahead = witness is not None and compare(run_id, len(events), witnessed)
        # "output": the witness advances only after an output point's sync, never ahead
        # of what a power cut leaves (records past it may still be unsynced).
        if witness is not None and ahead and owner and self.durability != "output":
            witness.advance(run_id, len(events))
        if owner:  # a run exported as a move is driven where it was imported, not here
            refuse_moved(self._store, run_id, events)
        return events


def _abandoned(started: Started | Exception | None) -> None:
    """A new run whose drive was cancelled while its start was recorded: no longer driven
    here (its lease in the store expires, as a crashed drive's)."""
    if isinstance(started, tuple) and started[1] is not None:
        stop_driving(started[1].owner, started[0].run_id)
