"""The embedded default store: one SQLite file in WAL mode, stdlib ``sqlite3`` only.

Every write is one ``BEGIN IMMEDIATE ... COMMIT`` transaction, so a journal append
and the run's status change land together or not at all. Opening never writes
before the file has been recognised as an empty database or a crashproof ledger
this version can read.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from crashproof.errors import (
    IntegrityError,
    LedgerError,
    NotALedger,
    RunNotFound,
    SchemaTooNew,
    StaleLeaseError,
)
from crashproof.journal.codec import encode
from crashproof.journal.records import Event, RunRow, RunStatus
from crashproof.store.checkpointing import Checkpointer
from crashproof.store.deltas import DeltaMemo, Resolver
from crashproof.store.index import IndexQuery
from crashproof.store.intents import IntentHold, raw_change
from crashproof.store.migrate import check_automatic, run_migration, split_statements
from crashproof.store.port import (
    GENESIS,
    VERSION_FRESH,
    Lease,
    LedgerClock,
    RecordAppend,
    RecordSealer,
    StatusChange,
    check_claimable,
    lease_was_live,
)
from crashproof.store.queue import Claimed, LeaseInfo
from crashproof.store.sql import load_migrations, load_queries, load_schema
from crashproof.store.sqlite_file import check_file, enter_wal
from crashproof.store.sqlite_journal import JournalEnd, SQLiteJournal
from crashproof.store.sqlite_rows import apply_change, check_rows, insert_record
from crashproof.store.syncing import GroupSync, Note, WalSyncer

__all__ = ["SQLiteStore"]

_Q = load_queries("sqlite")
_QUEUE = load_queries("sqlite", "queue.sql")
_MIGRATIONS = load_migrations("sqlite")
SCHEMA_VERSION = _MIGRATIONS[-1].version
# "output": commits ride in the WAL unsynced; append(durable=True) and sync() force one.
_SYNCHRONOUS = {"output": "NORMAL", "full": "FULL", "normal": "NORMAL"}
_META_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'crashproof_meta'"

# A journal record exactly as sealed: seq, type, key, payload text, value text (wherever
# kept, a delta resolved to the full text), created_at, key_id, mac. Used by checkpoint
# export/import only.
RawRecord = tuple[int, str, str | None, str, str | None, float, str | None, str | None]
# What a batch's wait for the disk waits for (write_batch): the store's commit count after
# it, and the output points it kept, by run (GroupSync.wait's ticket and note).
SyncTicket = tuple[int, Note]


class SQLiteStore(SQLiteJournal):
    """A ledger in one SQLite file. Thread-safe: one connection behind a lock."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "output",
        busy_timeout: float = 5.0,
        sealer: RecordSealer | None = None,
    ) -> None:
        """``sealer``: seal every record with an HMAC chain and verify it on every read
        (the Ledger always passes one; the bare store is also usable without).
        ``durability``: "output" (commit to the WAL unsynced; ``append(durable=True)``
        and ``sync()`` force one fdatasync, shared by concurrent callers), "full" (every
        commit synced) or "normal" (never forced)."""
        if durability not in _SYNCHRONOUS:
            raise ValueError(
                f"durability must be one of {sorted(_SYNCHRONOUS)}, not {durability!r}"
            )
        self.path = Path(path)
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()  # the loads' connection's (_reading)
        self._read_conn: sqlite3.Connection | None = None
        self._read_resolver: Resolver | None = None
        self._deltas = DeltaMemo()
        self._verified = None  # the last journal loaded whole, reused once (_load_events)
        self._busy_timeout = busy_timeout
        self._sealer = sealer
        self.durability = durability
        self.clock = LedgerClock(time.time)
        # Commits so far, the tickets of forced syncs; the first is what the file held when
        # opened (a crashed process may have left commits there unsynced).
        self._commits = 1
        # Each run's journal end as this connection last committed it: (next seq, last MAC,
        # fencing token, run_no), valid while PRAGMA data_version is unchanged, i.e. no
        # other connection committed since; any other write through this store clears it.
        self._ends: dict[str, JournalEnd] = {}
        self._ends_version: int | None = None
        self._version = (0, -VERSION_FRESH)  # schema_version(): (version, when read)
        self._wal_sync = WalSyncer(self.path)
        self._group = GroupSync(self._flush)
        # Called under the store's lock at every forced sync, before the fdatasync, with
        # the database path: test instrumentation (count syncs, snapshot what is durable).
        self.on_sync: list[Callable[[Path], None]] = []
        check_file(self.path)
        try:
            self._conn = sqlite3.connect(
                self.path,
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,
                timeout=busy_timeout,
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {self.path}: {exc}") from None
        self._cursor = self._conn.cursor()  # the appends' (under the lock)
        self._resolver = Resolver(self._conn, check_digest=sealer is None)
        try:
            self._open(durability, busy_timeout)
            threshold = int(self._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
        except BaseException:
            self._conn.close()
            raise
        self._checkpoints = Checkpointer(self.path, busy_timeout, self._lock, threshold)

    # -- opening -----------------------------------------------------------

    def _open(self, durability: str, busy_timeout: float) -> None:
        with self._errors():
            found = self._checked_version()  # before anything is written to the file
            enter_wal(self._conn, busy_timeout)
            self._conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[durability]}")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            self._conn.execute("PRAGMA foreign_keys=ON")
            for _attempt in range(3):
                if self._migrate(found):
                    return
                # Another process created or migrated the ledger meanwhile (workers
                # starting together): what it left is checked again like any ledger.
                found = self._checked_version()
            raise LedgerError(
                f"{self.path}: its schema kept changing while this process opened it "
                "(other processes migrating it?); nothing was changed by this one. Retry."
            )

    def _checked_version(self) -> int:
        """The ledger's schema version (0: an empty database), once the file is known
        to be a ledger this version can open (NotALedger, SchemaTooNew otherwise)."""
        tables = {
            row[0]
            for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if not tables:
            return 0
        if "crashproof_meta" not in tables:
            raise NotALedger(
                f"{self.path} is a SQLite database but not a crashproof ledger "
                f"(it has tables {sorted(tables)[:5]}); nothing was changed. "
                "Point --db at a new file or an existing ledger."
            )
        found = self._read_version()
        if found > SCHEMA_VERSION:
            too_new = SchemaTooNew(found, SCHEMA_VERSION)
            # Name the file too: the user may have several ledgers.
            too_new.args = (f"{self.path}: {too_new}",)
            raise too_new
        # Only a purely additive migration runs on open (store/migrate.py).
        check_automatic(self._conn, found, str(self.path))
        return found

    def _read_version(self) -> int:
        row = self._conn.execute(_Q["get_meta"], ("schema_version",)).fetchone()
        if row is None or not str(row[0]).isdigit():
            raise IntegrityError(f"{self.path}: the ledger's schema version is missing or invalid")
        return int(row[0])

    def _migrate(self, current: int) -> bool:
        """Bring the ledger from schema ``current`` to this version's; False when another
        process got there first (the version found in the transaction is not
        ``current``): nothing was written, the caller checks the file again."""
        pending = [m for m in _MIGRATIONS if m.version > current]
        if not pending:
            return True
        with self._transaction() as conn:
            if current and self._read_version() != current:
                return False
            if not current and conn.execute(_META_TABLE).fetchone() is not None:
                return False
            if not current:  # a new ledger: schema.sql, equal to all migrations (tested)
                for statement in split_statements(load_schema("sqlite")):
                    conn.execute(statement)
            for migration in pending:
                if current:
                    run_migration(conn, migration, str(self.path))
                conn.execute(
                    _Q["record_migration"], (migration.version, migration.name, time.time())
                )
            conn.execute(_Q["set_meta"], ("schema_version", str(SCHEMA_VERSION)))
        return True

    # -- the port ----------------------------------------------------------

    def schema_version(self) -> int:
        read, at = self._version  # read in the last second (store/port.py: VERSION_FRESH)
        if time.monotonic() - at < VERSION_FRESH:
            return read
        with self._lock, self._errors():
            found = self._read_version()
        self._version = (found, time.monotonic())
        return found

    def create_run(self, row: RunRow, first: Event, lease: Lease | None = None) -> RunRow | None:
        with self._transaction(row.run_id) as conn:
            run_no = _insert_run_row(conn, row, lease)
            if run_no is None:
                existing = conn.execute(_Q["get_run"], (row.run_id,)).fetchone()
                return _row(existing)
            self._insert_events(conn, (first,), GENESIS, run_no)
            return None

    def create_runs(
        self, runs: Sequence[tuple[RunRow, Event, Lease | None]]
    ) -> list[RunRow | None]:
        """``create_run`` of several runs in one transaction (an async loop's starts of
        one turn: runtime/driving/lifecycle.py); per run None, or the row that exists."""
        out: list[RunRow | None] = []
        with self._transaction(*(row.run_id for row, _first, _lease in runs)) as conn:
            for row, first, lease in runs:
                run_no = _insert_run_row(conn, row, lease)
                if run_no is None:
                    out.append(_row(conn.execute(_Q["get_run"], (row.run_id,)).fetchone()))
                else:
                    self._insert_events(conn, (first,), GENESIS, run_no)
                    out.append(None)
        return out

    def get_run(self, run_id: str) -> RunRow | None:
        with self._lock, self._errors():
            found = self._conn.execute(_Q["get_run"], (run_id,)).fetchone()
        return None if found is None else _row(found)

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        """``get_run`` of several runs in one read (an async loop's starts of one turn:
        runtime/driving/lifecycle.py): the rows of those that exist, by run id."""
        with self._lock, self._errors():
            found = self._conn.execute(
                _Q["get_runs"], (encode(list(run_ids), what="run ids"),)
            ).fetchall()
        return {row[0]: _row(row) for row in found}

    def list_runs(self, status: RunStatus | None = None) -> list[RunRow]:
        with self._lock, self._errors():
            if status is None:
                rows = self._conn.execute(_Q["list_runs"]).fetchall()
            else:
                rows = self._conn.execute(_Q["list_runs_by_status"], (status.value,)).fetchall()
        return [_row(r) for r in rows]

    def now(self) -> float:
        with self._lock, self._errors():  # the newest time the ledger holds
            (floor,) = self._conn.execute(_Q["clock_floor"]).fetchone()
        return self.clock.read(floor)

    def unresolved_intents(self, run_id: str | None = None) -> list[IntentHold]:
        with self._lock, self._errors():
            rows = self._conn.execute(_Q["unresolved_intents"]).fetchall()
        return [IntentHold(*r) for r in rows if run_id is None or r[0] == run_id]

    def claim(
        self, run_id: str, owner: str, ttl_seconds: float, *, take_over: bool | str = False
    ) -> Lease:
        with self._transaction(run_id) as conn:
            found = conn.execute(_Q["get_lease"], (run_id,)).fetchone()
            if found is None:
                raise RunNotFound(f"no run {run_id!r} in ledger {self.path}")
            held_by, expires_at, token = found
            now = time.time()  # one host: the local clock
            check_claimable(run_id, held_by, expires_at, now, owner, take_over)
            live = lease_was_live(held_by, expires_at, now, owner)
            lease = Lease(owner, token + 1, now + ttl_seconds, ttl_seconds, held_by, live)
            conn.execute(_Q["claim_lease"], (owner, lease.expires_at, run_id))
            return lease

    def renew(self, run_id: str, lease: Lease) -> Lease:
        expires_at = time.time() + lease.ttl_seconds
        with self._transaction(run_id) as conn:
            cur = conn.execute(_Q["renew_lease"], (expires_at, run_id, lease.owner, lease.token))
            if cur.rowcount == 0:
                raise StaleLeaseError(
                    f"run {run_id!r}: the lease of worker {lease.owner} (fencing token "
                    f"{lease.token}) is no longer current; another worker owns the run"
                )
        return Lease(lease.owner, lease.token, expires_at, lease.ttl_seconds)

    def renew_many(self, leases: Sequence[tuple[str, Lease]]) -> dict[str, Lease]:
        """``renew`` of several runs' leases in one statement: the leases renewed, by run
        id (one missing: its owner or token is no longer current, as StaleLeaseError)."""
        asked = [[run_id, lease.owner, lease.token, lease.ttl_seconds] for run_id, lease in leases]
        with self._transaction(*(run_id for run_id, _ in leases)) as conn:
            rows = conn.execute(
                _Q["renew_leases"], (time.time(), encode(asked, what="leases"))
            ).fetchall()
        given = dict(leases)
        return {
            run_id: Lease(
                given[run_id].owner, given[run_id].token, expires, given[run_id].ttl_seconds
            )
            for run_id, expires in rows
        }

    def release(self, run_id: str, lease: Lease) -> None:
        with self._transaction(run_id) as conn:
            conn.execute(_Q["release_lease"], (run_id, lease.owner, lease.token))

    def close(self) -> None:
        self._close_reader()
        self._checkpoints.close()  # before the last connection's own checkpoint
        with self._lock:
            self._conn.close()
            self._wal_sync.close()

    # -- the work queue (crashproof.store.queue) ------------------------------

    def claim_next(
        self,
        owner: str,
        ttl_seconds: float,
        runnable: Sequence[str],
        *,
        exclude: Sequence[str] = (),
    ) -> Claimed | None:
        # One BEGIN IMMEDIATE: the single writer picks and claims before anyone else can.
        with self._transaction() as conn:
            now = time.time()  # one host: the local clock
            params = {
                "now": now,
                "runnable": encode(list(runnable), what="workflow versions"),
                "exclude": encode(list(exclude), what="run ids"),
            }
            found = conn.execute(_QUEUE["next_runnable"], params).fetchone()
            if found is None:
                return None
            run_id, previous, token, status, _ = found
            lease = Lease(owner, token + 1, now + ttl_seconds, ttl_seconds, previous)
            conn.execute(_Q["claim_lease"], (owner, lease.expires_at, run_id))
            retry = 0
            if status == "stopped":  # a retryable stop, due: one more automatic attempt
                (retry,) = conn.execute(_QUEUE["count_retry"], (run_id,)).fetchone()
            return Claimed(run_id, lease, previous, int(retry))

    def schedule_retry(self, run_id: str, delay: float, retries: int) -> float | None:
        with self._transaction(run_id) as conn:
            at = time.time() + delay  # one host: the local clock
            changed = conn.execute(_QUEUE["schedule_retry"], (at, retries, run_id)).rowcount
        return at if changed else None

    # -- the run index (crashproof.store.index) ------------------------------

    def index_page(self, query: IndexQuery, offset: int, limit: int) -> tuple[list[RunRow], int]:
        params = {**query.params(), "offset": max(0, offset), "limit": limit}
        with self._lock, self._errors():
            rows = self._conn.execute(_Q["index_page"], params).fetchall()
            (total,) = self._conn.execute(_Q["index_count"], query.params()).fetchone()
        return [_row(r) for r in rows], int(total)

    def index_summary(self) -> tuple[dict[str, int], list[str]]:
        with self._lock, self._errors():
            rows = self._conn.execute(_Q["index_summary"]).fetchall()
        counts: dict[str, int] = {}
        for status, _, n in rows:
            counts[status] = counts.get(status, 0) + int(n)
        return counts, sorted({workflow for _, workflow, _ in rows})

    def index_marks(self) -> list[tuple[str, str, float]]:
        with self._lock, self._errors():
            return [tuple(r) for r in self._conn.execute(_Q["index_marks"]).fetchall()]

    def index_outbox_runs(self) -> set[str]:
        with self._lock, self._errors():
            return {r[0] for r in self._conn.execute(_Q["index_outbox_runs"]).fetchall()}

    def index_reconciled_runs(self) -> set[str]:
        with self._lock, self._errors():
            return {r[0] for r in self._conn.execute(_Q["index_reconciled_runs"]).fetchall()}

    def leases(self) -> dict[str, LeaseInfo]:
        with self._lock, self._errors():
            rows = self._conn.execute(_QUEUE["leases"]).fetchall()
        return {row[0]: LeaseInfo(*row[1:]) for row in rows}

    # -- forced syncs (durability "output") -----------------------------------

    def append(
        self,
        events: Sequence[Event],
        status: StatusChange | None = None,
        *,
        fencing_token: int | None = None,
        durable: bool = False,
    ) -> None:
        if not events:
            return
        run_id = events[0].run_id
        self._append(events, status, fencing_token, run_id)
        if durable and self.durability == "output":
            self._group.wait(self._commits, {run_id: events[-1].seq + 1})

    def append_batch(
        self, groups: Sequence[Sequence[RecordAppend]]
    ) -> list[tuple[int, Exception] | None]:
        """Several runs' records in one transaction (``SQLiteJournal._append_batch``);
        returns once an output point among them is durable, as ``append`` would."""
        results, ticket = self.write_batch(groups)
        if ticket is not None:
            self.wait_durable(ticket)
        return results

    def write_batch(
        self, groups: Sequence[Sequence[RecordAppend]]
    ) -> tuple[list[tuple[int, Exception] | None], SyncTicket | None]:
        """``append_batch`` without its waits: the results, and what to hand
        ``wait_durable`` when an output point among them is not on disk yet (None:
        nothing to wait for). An async loop writes here on its own thread and waits for
        the disk in another (runtime/driving/batching.py); SQLite's checkpoint runs in
        a thread too (store/checkpointing.py)."""
        results, note = self._append_batch(groups, defer_checkpoint=True)
        if note is None or self.durability != "output":
            return results, None
        return results, (self._commits, note)

    def wait_durable(self, *tickets: SyncTicket) -> None:
        """Returns once the commits up to the latest of ``tickets`` (``write_batch``'s) are
        durable, and ``on_durable`` was told of every output point they kept: one
        fdatasync and one witness write for all of them, shared with whoever needs one at
        the same time (GroupSync)."""
        if not tickets:
            return
        notes: dict[str, int] = {}
        for _commits, note in tickets:
            for run_id, generation in note.items():
                if notes.get(run_id, -1) < generation:
                    notes[run_id] = generation
        self._group.wait(max(commits for commits, _note in tickets), notes)

    def sync(self) -> None:
        # "full" synced every commit already, "normal" never forces one.
        if self.durability == "output":
            self._group.wait(self._commits)

    @property
    def on_durable(self) -> Callable[[dict[str, int]], None] | None:
        """Told, after a forced sync, the runs whose durable appends it covered and their
        generations (run id -> next seq), before any of them goes on: the Ledger advances
        the witness there once for all (store/syncing.py, GroupSync.after). Best effort."""
        return self._group.after

    @on_durable.setter
    def on_durable(self, hook: Callable[[dict[str, int]], None] | None) -> None:
        self._group.after = hook

    @property
    def syncs(self) -> int:
        """How many forced syncs this store did (in "output" durability)."""
        return self._group.flushes

    def _flush(self) -> int:
        """The group's leader: sync every commit so far; returns how many that is."""
        with self._lock:
            covered = self._commits
            if self.on_sync:  # what they copy is no checkpoint's half-written file
                with self._checkpoints.paused():
                    for listener in self.on_sync:
                        listener(self.path)
        try:
            self._wal_sync()
        except OSError as exc:
            raise LedgerError(
                f"ledger {self.path}: its write-ahead log cannot be synced to disk ({exc}); "
                "the last commits may not survive a power cut, so nothing that depends on "
                "them was executed. Check the disk, then resume the run."
            ) from None
        return covered

    # -- checkpoints (crashproof.runtime.operations.transfer; not part of the port) -----

    @property
    def sealer(self) -> RecordSealer | None:
        return self._sealer

    def raw_events(self, run_id: str) -> list[RawRecord]:
        """The run's records exactly as sealed, a value kept as a text delta resolved to
        its full text (not verified: the caller verifies)."""
        with self._lock, self._errors():
            try:
                rows = self._conn.execute(_Q["load_events"], (run_id,)).fetchall()
                self._resolver.check()  # a stored value that cannot be resolved
            finally:
                self._resolver.reset()
        check_rows(run_id, rows)
        return [row[:8] for row in rows]

    def install_run(
        self, row: RunRow, records: Sequence[RawRecord], requests: Mapping[int, str]
    ) -> bool:
        """Insert ``row`` and its already-sealed records, and the request texts kept
        beside them (by seq), in one transaction, unless the run exists (then nothing is
        written and False is returned)."""
        with self._transaction() as conn:
            run_no = _insert_run_row(conn, row)
            if run_no is None:
                return False
            for record in records:
                request = requests.get(record[0])
                insert_record(conn, row.run_id, run_no, self._deltas, record, request)
                change = raw_change(record[1], record[2], record[3], record[5])
                if change is not None:  # what the run holds unresolved, as it held it
                    apply_change(conn, row.run_id, change, check=False)
            return True

    # -- internals ---------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, *run_ids: str) -> Iterator[sqlite3.Connection]:
        """``run_ids``: the runs whose journal ends (fencing tokens) this transaction may
        change; the other runs' ends stay known. None given: a migration, a queue claim...:
        every end is read again."""
        with self._lock, self._errors():
            if not run_ids:
                self._ends.clear()
            for run_id in run_ids:  # a thousand runs starting: the others' ends stay known
                self._ends.pop(run_id, None)
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
                self._commits += 1
            except BaseException:
                self._rollback(conn)
                raise


def _insert_run_row(
    conn: sqlite3.Connection, row: RunRow, lease: Lease | None = None
) -> int | None:
    """Insert a run's index row (held under ``lease``) unless the run exists; the new
    run's number (run_no), None when the run exists."""
    found = conn.execute(
        _Q["insert_run"],
        (
            row.run_id,
            row.workflow,
            row.version,
            row.status.value,
            row.reason,
            row.input_digest,
            row.created_at,
            row.updated_at,
            None if lease is None else lease.owner,
            None if lease is None else lease.expires_at,
            0 if lease is None else lease.token,
        ),
    ).fetchall()  # (RETURNING: read it all, or the statement is still in progress)
    return None if not found else int(found[0][0])


def _row(found: Any) -> RunRow:
    run_id, workflow, version, status, reason, input_digest, created_at, updated_at = found
    return RunRow(
        run_id=run_id,
        workflow=workflow,
        version=version,
        status=RunStatus(status),
        reason=reason,
        input_digest=input_digest,
        created_at=created_at,
        updated_at=updated_at,
    )
