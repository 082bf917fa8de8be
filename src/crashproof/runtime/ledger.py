"""The Ledger: a durable store plus the runtime that drives workflows over it. This
module opens it and holds the entry points that start runs and the ``DriveHost`` port;
a run's drive is ``runtime/drive.py``, its other roles the mixins it names."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from crashproof._faults import CrashPoints
from crashproof.errors import UnknownWorkflow
from crashproof.integrity.external import SealedState
from crashproof.integrity.keys import Keyring, resolve_keyring
from crashproof.integrity.seal import Sealer
from crashproof.integrity.witness import Witness, compare
from crashproof.journal.codec import storable
from crashproof.journal.records import Event
from crashproof.runtime.drive import LedgerDrive
from crashproof.runtime.driving.batching import StartBatch
from crashproof.runtime.driving.durability import share_witness_writes
from crashproof.runtime.driving.leases import HOST
from crashproof.runtime.driving.lifecycle import Started, StartRecord, record_start, start_record
from crashproof.runtime.driving.queue import Draining, LedgerQueue
from crashproof.runtime.driving.urls import (
    DURABILITY_MODES,
    default_witness,
    open_store,
    without_password,
)
from crashproof.runtime.guards.approvers import reserved
from crashproof.runtime.guards.binding import start_fields
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.operations.audit import started_by
from crashproof.runtime.operations.cancelling import LedgerCancel
from crashproof.runtime.operations.maintenance import LedgerCare
from crashproof.runtime.operations.moving import refuse_moved
from crashproof.runtime.operations.oversight import LedgerHumans
from crashproof.runtime.options import RunOptions
from crashproof.runtime.port import ActSettings
from crashproof.runtime.workflow import Registry, Workflow
from crashproof.store.port import Store

# DURABILITY_MODES and open_store live in runtime.driving.urls; re-exported for callers.
__all__ = ["DURABILITY_MODES", "Ledger", "open_store"]

R = TypeVar("R")


class Ledger(Registry, LedgerDrive, LedgerCare, LedgerHumans, LedgerCancel, LedgerQueue):
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
        store_requests: bool = True,
    ) -> None:
        """``durability``: "output" (default: a commit is forced to disk only before
        something leaves the process; driving/durability.py), "full" or "normal". ``key``:
        else integrity/keys.py's order (no key: ``KeyUnusable``). ``witness``: where
        generations are mirrored (a file beside a SQLite ledger by default). ``lease_seconds``:
        a lease's life unrenewed (renewed every third of it). ``clock``: this host's clock,
        a testing hook (Store.now reads it on SQLite). ``store_requests`` (default True): a
        model call's request is kept for people to read (the console, ``show --step``),
        beside its record, which holds its digest: a resume never reads it. False: the
        request is bound by its arguments digest only (prompts a team must not keep)."""
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
        self.url = url
        self.durability = durability
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
        self._store = store
        self._witness = witness
        share_witness_writes(store, witness)  # one witness write per group sync
        self._workflows: dict[str, Workflow[Any]] = {}
        self._policies: dict[str, Policy] = {}  # by version: runs find theirs on resume
        self.crash_points = crash_points
        self.act_settings = act_settings or ActSettings()
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
        if not storable(run_id):  # before anything is written, the same on every store
            raise ValueError(
                f"run_id {run_id!r} holds a NUL character or a lone surrogate, which a "
                "ledger cannot store; nothing was written: use UTF-8 text without NUL"
            )
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
