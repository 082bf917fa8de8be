"""The journal of a SQLite ledger: loading a run's records and appending to them.

A mixin of :class:`~crashproof.store.sqlite.SQLiteStore` (which owns the connection,
the lock and opening the file), kept apart because it is the hot path: every step,
decision and act of a run is one append, and every resume one load.

The usual append (one record right after the one this store wrote last) is a single
INSERT in autocommit mode that checks the run's last record and fencing token itself
(``insert_event_alone`` in queries.sql): three statements fewer than
``BEGIN IMMEDIATE; PRAGMA data_version; INSERT; COMMIT``, ~10 % of a step. Anything
else, or a refusal, takes the checked transaction, which names the cause.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from crashproof.errors import CrashproofError, IntegrityError, LedgerError
from crashproof.journal.records import Event, request_sha256
from crashproof.store.checkpointing import Checkpointer
from crashproof.store.deltas import DeltaMemo, Resolver
from crashproof.store.intents import change_of, touches
from crashproof.store.port import (
    BLOB_THRESHOLD,
    GENESIS,
    LedgerClock,
    RecordAppend,
    RecordSealer,
    StatusChange,
    blob_digest,
    check_append,
    seq_taken,
    unencodable,
    unreadable,
    without_result,
)
from crashproof.store.request_texts import kept_text
from crashproof.store.sql import load_queries
from crashproof.store.sqlite_rows import (
    RUN_SPAN,
    apply_change,
    check_rows,
    insert_record,
    insert_request,
)

__all__ = ["JournalEnd", "SQLiteJournal"]

_Q = load_queries("sqlite")
T = TypeVar("T")
_INSERT_ALONE = _Q["insert_event_alone"]
# A run's journal end as a store last committed it: (next seq, last MAC, fencing token,
# run_no).
JournalEnd = tuple[int, str | None, int, int]


class SQLiteJournal:
    """Load and append journal records (mixed into SQLiteStore, which sets these)."""

    path: Path
    durability: str
    clock: LedgerClock
    _lock: threading.Lock
    _conn: sqlite3.Connection
    _cursor: sqlite3.Cursor
    _sealer: RecordSealer | None
    _commits: int
    _ends: dict[str, JournalEnd]
    _ends_version: int | None
    _read_lock: threading.Lock
    _read_conn: sqlite3.Connection | None
    _read_resolver: Resolver | None
    _resolver: Resolver  # the shared connection's (raw_events)
    _deltas: DeltaMemo  # each run's last large value, written as the next one's base
    _busy_timeout: float
    _checkpoints: Checkpointer  # of the commits that leave theirs to a thread
    # The journal the last whole load verified: (run id, its records, the last MAC).
    _verified: tuple[str, list[Event], str] | None

    def load_events(self, run_id: str, *, results: bool = True) -> list[Event]:
        # Tens of thousands of new objects (rows, then Events), none in a cycle: without
        # the collector's passes over them (and everything else alive), a long journal
        # loads faster. Only this method's own code runs while it is off.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._load_events(run_id, Event.read if results else without_result)
        finally:
            if collecting:
                gc.enable()

    def load_requests(self, run_id: str) -> dict[int, str]:
        parts: dict[int, list[str]] = {}
        with self._reading() as conn:
            for seq, part in conn.execute(_Q["load_requests"], (run_id,)):
                parts.setdefault(seq, []).append(part)
        return {seq: kept_text("".join(texts)) for seq, texts in parts.items()}

    def request_digests(self, run_id: str) -> dict[int, str]:
        """Each kept request's SHA-256 by record seq (``request_sha256`` of its text), for
        ``crashproof check``: its parts hashed as they are read, so a run's requests are
        never in memory together (the UTF-8 of whole characters, part after part, is the
        text's). A text kept as its JSON string (store/request_texts.py) is read whole
        and hashed as the text it gives back."""
        digests: dict[int, str] = {}
        at, sha = -1, hashlib.sha256()
        quoted: list[str] | None = None
        with self._reading() as conn:
            for seq, part in conn.execute(_Q["load_requests"], (run_id,)):
                if seq != at:
                    if at >= 0:
                        digests[at] = _digest(sha, quoted)
                    at, sha = seq, hashlib.sha256()
                    quoted = [] if part[:1] == '"' else None
                if quoted is not None:
                    quoted.append(part)
                else:
                    sha.update(part.encode())
        if at >= 0:
            digests[at] = _digest(sha, quoted)
        return digests

    def _load_events(self, run_id: str, make: Callable[..., Event]) -> list[Event]:
        """The run's records, verified. A whole load is kept and reused by the next load,
        once: a drive reads its run's journal for the verdict, then again under its lease,
        and the second read verifies only what follows the first (whose last record must
        still carry the same MAC) instead of the whole chain again (#42). Reused records
        are the ones verified a moment before, never bytes read again unverified; the
        load after the reuse reads and verifies everything, so a byte changed in the file
        meanwhile is caught there, as by any other process (tests/crash/test_tamper_cached.py)."""
        kept, self._verified = self._verified, None
        if self._sealer is not None:  # every record verified before anything parses it
            try:
                with self._reading() as conn:
                    if kept is not None and kept[0] == run_id and make == Event.read:
                        more = self._after(conn, kept[1], kept[2])
                        if more is not None:
                            return [*kept[1], *more]
                    # Verified and built as the rows arrive (payloads stay text until
                    # read: Event.read), the rows fetched without load_events' extras.
                    cursor = conn.execute(_Q["load_records"], (run_id,))
                    try:
                        built, mac = self._sealer.verify_rows_from(run_id, cursor, make, GENESIS)
                    finally:
                        cursor.close()  # done, or stopped at a fault: no statement left open
                    if built and make == Event.read:
                        self._verified = (run_id, built, mac)
                    return built
            except IntegrityError:
                check_rows(run_id, self._rows(run_id))  # a missing blob, another run's
                raise
            except KeyError:  # a record of an unknown type
                raise unreadable(run_id, self._rows(run_id)) from None
        rows = self._rows(run_id)
        check_rows(run_id, rows)
        try:
            return [
                make(run_id, seq, type_, key, payload, created_at, value)
                for seq, type_, key, payload, value, created_at, _kid, _mac, _blob, _other in rows
            ]
        except KeyError:
            raise unreadable(run_id, rows) from None

    def _after(self, conn: sqlite3.Connection, known: list[Event], mac: str) -> list[Event] | None:
        """The records after ``known`` (verified, its last MAC ``mac``), verified from it;
        None when its last record is no longer the one verified (the journal was
        replaced): the caller loads it whole."""
        sealer = self._sealer
        if sealer is None or not known:
            return None
        last = known[-1]
        cursor = conn.execute(_Q["load_records_from"], (last.run_id, last.seq))
        try:
            first = cursor.fetchone()
            if first is None or first[0] != last.seq or first[7] != mac:
                return None
            more, _mac = sealer.verify_rows_from(last.run_id, cursor, Event.read, mac)
            return more
        finally:
            cursor.close()

    def _rows(self, run_id: str) -> list[Any]:
        with self._reading() as conn:
            rows = conn.execute(_Q["load_events"], (run_id,)).fetchall()
            if self._read_resolver is not None:
                self._read_resolver.check()  # a stored value that cannot be resolved
            return rows

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection journals are loaded on: one of their own (read-only, opened on
        first use), so a long load, verified as it reads, holds neither the store's lock
        nor its connection, and other runs' appends go on meanwhile (in WAL mode a
        reader sees every commit made before it began and never waits for the writer).
        Its texts resolved from deltas are forgotten after each use."""
        with self._read_lock, self._errors():
            conn = self._read_conn
            if conn is None:
                conn = sqlite3.connect(
                    self.path,
                    isolation_level=None,
                    check_same_thread=False,
                    timeout=self._busy_timeout,
                )
                conn.execute("PRAGMA query_only=ON")
                self._read_resolver = Resolver(conn, check_digest=self._sealer is None)
                self._read_conn = conn
            try:
                yield conn
            finally:
                if self._read_resolver is not None:
                    self._read_resolver.reset()

    def _close_reader(self) -> None:
        with self._read_lock:
            conn, self._read_conn = self._read_conn, None
            self._read_resolver = None
            if conn is not None:
                conn.close()

    def _append(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        fencing_token: int | None,
        run_id: str,
    ) -> None:
        # _transaction and _errors, inlined (this runs for every journal commit). One
        # cursor for every append: conn.execute would make and drop a cursor per statement.
        with self._lock:
            end = self._ends.get(run_id)
            if end is not None and status is None and len(events) == 1:
                # The usual append, one record right after the one this store wrote
                # last, as one statement in autocommit mode: the statement itself checks
                # that the run's fencing token and last record are still what this store
                # knows (insert_event_alone). Skipped, or refused (nothing written): the
                # checked path below decides. (_sealed, Event.payload_text, blob_digest
                # and row_id inlined: this runs for every record of a live run.)
                event = events[0]
                value = event.value_json
                seq = event.seq
                if (
                    seq == end[0]  # (>= 0)
                    and seq < RUN_SPAN
                    and (value is None or len(value) < BLOB_THRESHOLD)  # else kept apart
                    and not self._conn.in_transaction
                    and not touches(event)  # the index too: +70-150 us an act (benchmarks.md)
                ):
                    payload = event.payload_json
                    if payload is None:
                        payload = event.payload_text
                    type_ = event.type._value_
                    created_at = event.created_at
                    sealer = self._sealer
                    if sealer is None:
                        key_id = mac = None
                    else:
                        key_id, mac = sealer.seal(
                            run_id,
                            seq,
                            type_,
                            event.key,
                            payload,
                            value,
                            created_at,
                            end[1] or GENESIS,
                        )
                    request = event.request_text
                    cursor = self._cursor
                    try:
                        if request is not None:  # its parts in the same transaction
                            cursor.execute("BEGIN IMMEDIATE")
                        cursor.execute(
                            _INSERT_ALONE,
                            (
                                (end[3] << 32) + seq,  # row_id: the run's run_no is known
                                run_id,
                                seq,
                                type_,
                                event.key,
                                payload,
                                value,
                                created_at,
                                key_id,
                                mac,
                                fencing_token,
                            ),
                        )
                        if request is not None:
                            insert_request(cursor, (end[3] << 32) + seq, request)
                            cursor.execute("COMMIT")
                    except sqlite3.DatabaseError:  # its check refused, a taken seq, busy...
                        if request is not None:
                            self._rollback(cursor)
                        self._ends.pop(run_id, None)
                    except UnicodeEncodeError as exc:  # a lone surrogate: nothing kept
                        self._rollback(cursor)
                        raise LedgerError(unencodable(f"ledger {self.path}", exc)) from None
                    except BaseException:
                        self._rollback(cursor)
                        raise
                    else:
                        self._commits += 1
                        # The token as the statement saw it.
                        token = end[2] if fencing_token is None else fencing_token
                        self._ends[run_id] = (seq + 1, mac, token, end[3])
                        return
            self._immediate(
                lambda cur: self._append_locked(cur, events, status, fencing_token, run_id)
            )

    def _immediate(self, write: Callable[[sqlite3.Cursor], T]) -> T:
        """``write`` in one write transaction on the shared connection (under the lock):
        committed, or rolled back and SQLite's error turned into a clear one."""
        cur = self._cursor
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                out = write(cur)
                cur.execute("COMMIT")
                self._commits += 1
                return out
            except BaseException:
                self._rollback(cur)
                raise
        except sqlite3.DatabaseError as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from None

    def _append_batch(
        self, groups: Sequence[Sequence[RecordAppend]], defer_checkpoint: bool = False
    ) -> tuple[list[tuple[int, Exception] | None], dict[str, int] | None]:
        """Commit the records of several runs in one transaction: a refused record (its
        fencing token, its seq, an intent held) keeps nothing of itself and skips the
        rest of its run's group, and the other runs' records commit anyway. Per group:
        None, or (index, error) of the first record not kept. An error of the
        transaction itself (disk full, busy) is raised for all. One commit for many
        runs' records is what lets a thousand async drives on a loop commit without one
        transaction each (docs/benchmarks.md). Also returns, by run id, the next seq
        after the last output point kept, if any: the caller waits for the disk then
        (SQLiteStore.append_batch). ``defer_checkpoint``: SQLite's automatic checkpoint
        runs in the checkpointer's thread, not in this commit (store/checkpointing.py:
        an async loop's commits)."""
        results: list[tuple[int, Exception] | None] = [None] * len(groups)
        notes: dict[str, int] = {}
        conn = self._conn

        def write(cur: sqlite3.Cursor, careful: bool) -> None:
            results[:] = [None] * len(groups)
            notes.clear()  # (again after a _Partial)
            # Constant for the transaction: it holds the write lock, no one else commits.
            version = cur.execute("PRAGMA data_version").fetchone()[0]
            for g, group in enumerate(groups):
                for i, (events, status, token, durable) in enumerate(group):
                    run_id = events[0].run_id
                    # A record is refused before it writes (its token, its seq, an intent
                    # held) or by its one INSERT, undone alone: no savepoint, two
                    # statements of a longer record's ~four. A refusal after a write of
                    # its own (never seen but possible) has the transaction done again,
                    # ``careful``: every longer record under a savepoint.
                    saved = careful and not _one_statement(events)
                    if saved:
                        cur.execute("SAVEPOINT record")
                    changes = conn.total_changes
                    try:
                        self._append_locked(cur, events, status, token, run_id, version)
                    except CrashproofError as exc:  # this record's own refusal
                        if saved:
                            cur.execute("ROLLBACK TO record")
                            cur.execute("RELEASE record")
                        elif conn.total_changes != changes:
                            raise _Partial from exc  # rolled back, then done carefully
                        self._ends.pop(run_id, None)
                        self._deltas.forget(run_id)  # its blob rows were undone too
                        results[g] = (i, exc)
                        break
                    if saved:
                        cur.execute("RELEASE record")
                    if durable:
                        notes[run_id] = events[-1].seq + 1

        def commit(careful: bool) -> None:
            if not defer_checkpoint:
                self._immediate(lambda cur: write(cur, careful))
                return
            records = sum(len(record[0]) for group in groups for record in group)
            self._immediate_deferred(lambda cur: write(cur, careful), records)

        with self._lock:
            try:
                commit(careful=False)
            except _Partial:
                commit(careful=True)
        return results, notes or None

    def _immediate_deferred(self, write: Callable[[sqlite3.Cursor], None], records: int) -> None:
        """``_immediate``, SQLite's automatic checkpoint left to the checkpointer's thread
        (store/checkpointing.py) unless it fell behind; under the lock."""
        checkpoints = self._checkpoints
        if not checkpoints.defer():
            self._immediate(write)
            return
        # (Each returns a row: read, so the statement ends; an open one would keep the
        # connection from closing, and its log from being removed.)
        cur = self._cursor
        cur.execute("PRAGMA wal_autocheckpoint=0").fetchone()
        try:
            self._immediate(write)
        finally:
            cur.execute(f"PRAGMA wal_autocheckpoint={checkpoints.threshold}").fetchone()
        checkpoints.wrote(records)

    def _append_locked(
        self,
        conn: sqlite3.Cursor,
        events: Sequence[Event],
        status: StatusChange | None,
        fencing_token: int | None,
        run_id: str,
        version: int | None = None,
    ) -> None:
        # The primary key only refuses a taken seq; a gap, a reorder or a missing run
        # would slip through it, so check the batch against the journal's end first:
        # the one this connection committed last, unless anyone else committed since.
        # (Within a transaction, the check as a guard in the INSERT instead of PRAGMA
        # data_version saved 1k of ~170k instructions per step; _append_alone's saving
        # is leaving out the transaction's statements.)
        if version is None:  # (a batch reads it once)
            version = conn.execute("PRAGMA data_version").fetchone()[0]
        found = self._ends.get(run_id) if version == self._ends_version else None
        if found is None:
            found = conn.execute(_Q["journal_end"], (run_id,)).fetchone()
        found = check_append(run_id, str(self.path), found, fencing_token, events)
        for event in events:  # the index of unresolved intents, in the same transaction
            change = change_of(event)
            if change is not None:
                apply_change(conn, run_id, change, check=True)
        mac = self._insert_events(conn, events, found[1] or GENESIS, found[3])
        if status is not None:
            conn.execute(
                _Q["set_status"],
                (status[0].value, _utf8(status[1]), self.clock.clock(), events[0].run_id),
            )
            if status[0].terminal:
                self._deltas.forget(run_id)  # no later value to store as its delta
        if version != self._ends_version:
            self._ends.clear()  # someone else wrote: what was known is stale
            self._ends_version = version
        # Under the lock; a failed COMMIT clears it again (_rollback).
        self._ends[run_id] = (found[0] + len(events), mac, found[2], found[3])

    def _insert_events(
        self,
        conn: sqlite3.Connection | sqlite3.Cursor,
        events: Sequence[Event],
        prev_mac: str,
        run_no: int | None,
    ) -> str | None:
        """Insert and seal ``events`` (of the run numbered ``run_no``) after ``prev_mac``;
        the last MAC (None unsealed)."""
        mac = None
        try:
            for event in events:
                payload, key_id, mac = self._sealed(event, prev_mac)
                prev_mac = mac or prev_mac
                insert_record(
                    conn,
                    event.run_id,
                    run_no,
                    self._deltas,
                    (
                        event.seq,
                        event.type._value_,
                        event.key,
                        payload,
                        event.value_json,
                        event.created_at,
                        key_id,
                        mac,
                    ),
                    event.request_text,
                )
        except sqlite3.IntegrityError:
            raise seq_taken(events[0]) from None
        except UnicodeEncodeError as exc:  # this record's own refusal, not its batch's
            raise LedgerError(unencodable(f"ledger {self.path}", exc)) from None
        return mac

    def _sealed(self, event: Event, prev_mac: str) -> tuple[str, str | None, str | None]:
        """(payload text, key id, MAC) of a record about to be stored after ``prev_mac``:
        sealed over exactly the bytes stored (no key id or MAC without a sealer)."""
        payload = event.payload_text  # as built, else codec.encode: the one encoder
        if self._sealer is None:
            return payload, None, None
        key_id, mac = self._sealer.seal(
            event.run_id,
            event.seq,
            event.type._value_,
            event.key,
            payload,
            event.value_json,
            event.created_at,
            prev_mac,
        )
        return payload, key_id, mac

    def _rollback(self, conn: sqlite3.Connection | sqlite3.Cursor) -> None:
        # Also when COMMIT itself fails (disk full, I/O error): never leave the shared
        # connection inside a transaction (the caller re-raises the original error).
        # What was remembered of the undone writes goes too: a delta's base row with them.
        self._ends.clear()
        self._deltas.forget()
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn SQLite's low-level errors into clear crashproof ones."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            translated = self._translate(exc)
            if translated is None:
                raise  # a constraint: the caller turns a taken seq into StaleLeaseError
            raise translated from None

    def _translate(self, exc: sqlite3.DatabaseError) -> Exception | None:
        """The clear crashproof error for a SQLite error; None for a constraint."""
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return LedgerError(
                f"ledger {self.path} is locked by another process ({exc}); try again"
            )
        if isinstance(exc, sqlite3.IntegrityError):
            return None
        if isinstance(exc, sqlite3.OperationalError):
            return LedgerError(
                f"ledger {self.path} cannot be used ({exc}); nothing of this operation "
                "was kept. Check the disk, the file's permissions, and that no other "
                "program replaced the file while it was open."
            )
        return IntegrityError(
            f"ledger {self.path} is corrupt or not a ledger ({exc}); nothing was changed. "
            "Restore it from a backup, or point --db at another file."
        )


class _Partial(Exception):
    """A batch's record refused after it wrote part of itself (_append_batch)."""


def _one_statement(events: Sequence[Event]) -> bool:
    """Whether appending ``events`` writes one row in one statement (insert_record): one
    record, its value inline (no blob row), no change to the index of intents."""
    return (
        len(events) == 1
        and change_of(events[0]) is None
        and blob_digest(events[0].value_json) is None
        and events[0].request_text is None
    )


def _utf8(text: str | None) -> str | None:
    """A reason string SQLite can bind: lone surrogates become backslash escapes.
    (The index row is a display cache; the exact text stays in the journal.)"""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _digest(sha: Any, quoted: list[str] | None) -> str:
    """request_digests' digest of one text: its parts hashed, or read whole (quoted)."""
    if quoted is None:
        return str(sha.hexdigest())
    return request_sha256(kept_text("".join(quoted)))
