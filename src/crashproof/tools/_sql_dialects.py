"""How the SQL tools talk to a user's connection: sqlite3, or psycopg 3.

A dialect opens the act's one transaction, runs the statements, writes and reads the
receipt row, and sorts the driver's errors into what the act protocol needs to know:
did the statement fail (rolled back, nothing applied), may a retry succeed (a lock or a
serialization failure), or is the connection gone. psycopg is imported only for a
connection that is not a sqlite3 one, so ``import crashproof`` never needs it.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import weakref
from typing import Any, Literal, NamedTuple, Protocol

from crashproof.tools._sql_statements import split_sqlite

__all__ = ["ConnectionBusy", "Dialect", "Row", "dialect_for"]

Failure = Literal["statement", "retry", "connection"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# The columns of the receipt table, in the order ``Row`` has them.
_COLUMNS = "operation_id, intent_digest, run_id, step, kind, result, committed_at, fencing_token"
# Counted as rows affected (PostgreSQL's command tags); a SELECT's rows are not.
_CHANGES = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "COPY"})


class ConnectionBusy(Exception):
    """The connection has a transaction of the caller's open, so a lookup cannot read
    cleanly. Deliberately not an ``OutcomeUnknown``: the runtime retries the lookup, then
    stops the run resumable."""


class Row(NamedTuple):
    """One receipt row: the effect committed under ``operation_id``."""

    operation_id: str
    intent_digest: str
    run_id: str
    step: str
    kind: str
    result: str  # JSON
    committed_at: float  # epoch seconds, the database's clock
    fencing_token: int | None  # the run owner's token when it wrote the row


class Dialect(Protocol):
    """One connection's way of doing the act's transaction."""

    name: str
    instance: str
    # Held while the tool uses the connection: the runtime may call it from several
    # threads at once (receipts re-read concurrently on resume, an async drive's workers).
    lock: threading.Lock

    def read(self, operation_id: str) -> Row | None:
        """The committed receipt row, read outside any act's transaction (a lookup)."""

    def busy(self) -> str | None:
        """Why the connection cannot take the act's transaction now, or None."""

    def begin(self) -> None: ...

    def ensure_table(self) -> None: ...

    def receipt(self, operation_id: str) -> Row | None:
        """The receipt row, read inside the open transaction (or in a short one)."""

    def run(self, sql: str, args: list[Any] | None) -> tuple[int, int]:
        """Run the statements; (statements run, rows they changed)."""

    def fence(self, run_id: str) -> int | None:
        """The highest fencing token of ``run_id``'s receipts, under a lock that keeps
        other acts of the run out until this transaction ends."""

    def insert(self, row: Row) -> float:
        """Write the receipt row (its ``committed_at`` is ignored); the database's time."""

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def classify(self, exc: BaseException) -> Failure: ...


def dialect_for(connection: Any, table: str) -> Dialect:
    """The dialect of a sqlite3 or psycopg 3 connection; TypeError for anything else."""
    if not _IDENTIFIER.fullmatch(table):
        raise ValueError(f"receipt table name {table!r} must be a plain SQL identifier")
    if isinstance(connection, sqlite3.Connection):
        return _Sqlite(connection, table)
    kind = type(connection)
    if kind.__module__.startswith("psycopg"):
        if "Async" in kind.__name__:
            raise TypeError(
                f"a psycopg {kind.__name__} is not supported: pass a sync psycopg Connection "
                "(an async workflow runs the act in a worker thread)"
            )
        return _Postgres(connection, table)
    raise TypeError(f"expected a sqlite3 or psycopg 3 connection, got {type(connection).__name__}")


def _table_ddl(table: str) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (operation_id TEXT PRIMARY KEY, "
        "intent_digest TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL, "
        "kind TEXT NOT NULL, result TEXT NOT NULL, committed_at DOUBLE PRECISION NOT NULL, "
        "fencing_token BIGINT)"
    )


class _Sqlite:
    name = "sqlite"

    def __init__(self, conn: sqlite3.Connection, table: str) -> None:
        self.conn, self.table = conn, table
        self.lock = threading.Lock()
        self.file = _sqlite_file(conn)
        self.instance = f"sqlite:{self.file}"

    def read(self, operation_id: str) -> Row | None:
        if not self.file or self.file == ":memory:":  # only the caller's connection sees it
            with self.lock:
                if self.conn.in_transaction:
                    raise ConnectionBusy("the sqlite3 connection has a transaction open")
                return self.receipt(operation_id)
        # A connection of its own: a lookup may run in another thread than the one that
        # opened the caller's (sqlite3 refuses that by default), and it reads only what
        # was committed.
        if not os.path.exists(self.file):
            return None
        own = sqlite3.connect(self.file, timeout=30.0)
        try:
            return _Sqlite(own, self.table).receipt(operation_id)
        finally:
            own.close()

    def busy(self) -> str | None:
        if getattr(self.conn, "autocommit", -1) is False:  # Python 3.12's PEP 249 mode
            return (
                "the sqlite3 connection was opened with autocommit=False, so a transaction "
                "is always open; open it with the default or autocommit=True"
            )
        if self.conn.in_transaction:
            return "the sqlite3 connection has a transaction open; commit or roll it back first"
        return None

    def begin(self) -> None:
        # IMMEDIATE: the write lock now, so the receipt check and the insert are one unit.
        self.conn.execute("BEGIN IMMEDIATE")

    def ensure_table(self) -> None:
        self.conn.execute(_table_ddl(self.table))

    def receipt(self, operation_id: str) -> Row | None:
        found = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,)
        ).fetchone()
        if found is None:
            return None
        row = self.conn.execute(
            f"SELECT {_COLUMNS} FROM {self.table} WHERE operation_id = ?", (operation_id,)
        ).fetchone()
        return None if row is None else _row(row)

    def run(self, sql: str, args: list[Any] | None) -> tuple[int, int]:
        if args is not None:
            return 1, max(self.conn.execute(sql, args).rowcount, 0)
        statements = changed = 0
        line = 1
        for statement in split_sqlite(sql):
            try:
                changed += max(self.conn.execute(statement).rowcount, 0)
            except sqlite3.Error as exc:
                lead = len(statement) - len(statement.lstrip())
                exc.add_note(f"line {line + statement[:lead].count(chr(10))}")
                raise
            statements += 1
            line += statement.count("\n")
        return statements, changed

    def fence(self, run_id: str) -> int | None:
        # BEGIN IMMEDIATE holds the database's write lock already.
        found = self.conn.execute(
            f"SELECT max(fencing_token) FROM {self.table} WHERE run_id = ?", (run_id,)
        ).fetchone()
        return None if found is None or found[0] is None else int(found[0])

    def insert(self, row: Row) -> float:
        done = self.conn.execute(
            f"INSERT INTO {self.table} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, "
            "(julianday('now') - 2440587.5) * 86400.0, ?) RETURNING committed_at",
            (*row[:6], row.fencing_token),
        ).fetchone()
        return float(done[0])

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
            return "connection"
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED
            return "retry"
        return "statement"


def _sqlite_file(conn: sqlite3.Connection) -> str:
    try:
        for _, name, path in conn.execute("PRAGMA database_list").fetchall():
            if name == "main":
                return str(path) or ":memory:"
    except sqlite3.Error:
        pass
    return ""


# One lock per psycopg connection, shared by every tool on it: a resume re-reads several
# receipts at once, and one tool's lookup must not take another's query on the same
# connection for the caller's open transaction (``busy``: "not idle (ACTIVE)").
_CONNECTION_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_CONNECTION_LOCKS_GUARD = threading.Lock()


def _connection_lock(conn: Any) -> threading.Lock:
    with _CONNECTION_LOCKS_GUARD:
        try:
            return _CONNECTION_LOCKS.setdefault(conn, threading.Lock())
        except TypeError:  # not weakly referenceable: a lock of the tool's own
            return threading.Lock()


class _Postgres:
    name = "postgresql"

    def __init__(self, conn: Any, table: str) -> None:
        import psycopg  # only here: psycopg is optional

        self._psycopg = psycopg
        self.conn, self.table = conn, table
        self.lock = _connection_lock(conn)
        info = conn.info
        self.instance = f"postgresql:{info.host}:{info.port}/{info.dbname}"

    def read(self, operation_id: str) -> Row | None:
        with self.lock:
            why = self.busy()
            if why is not None:
                raise ConnectionBusy(why)
            return self.receipt(operation_id)

    def busy(self) -> str | None:
        status = self.conn.info.transaction_status
        if status != self._psycopg.pq.TransactionStatus.IDLE:
            return (
                f"the psycopg connection is not idle ({status.name}); commit or roll back "
                "its transaction first"
            )
        return None

    def begin(self) -> None:
        if self.conn.autocommit:
            self.conn.execute("BEGIN")
        # Otherwise psycopg begins the transaction with the first statement.

    def ensure_table(self) -> None:
        self.conn.execute(_table_ddl(self.table))

    def receipt(self, operation_id: str) -> Row | None:
        idle = self.conn.info.transaction_status == self._psycopg.pq.TransactionStatus.IDLE
        try:
            exists = self.conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()
            if exists is None or exists[0] is None:
                return None
            row = self.conn.execute(
                f"SELECT {_COLUMNS} FROM {self.table} WHERE operation_id = %s", (operation_id,)
            ).fetchone()
            return None if row is None else _row(row)
        finally:
            if idle:  # a read of its own: end the transaction psycopg may have begun
                self.conn.rollback()

    def run(self, sql: str, args: list[Any] | None) -> tuple[int, int]:
        cursor = self.conn.cursor()
        try:
            if args is not None:
                cursor.execute(sql, args)
            else:  # no parameters: the simple protocol, which runs a whole script
                cursor.execute(sql)
        except self._psycopg.Error as exc:
            position = exc.diag.statement_position  # 1-based, in characters
            if position and position.isdigit():
                exc.add_note(f"line {sql[: int(position) - 1].count(chr(10)) + 1}")
            raise
        statements = changed = 0
        while True:
            statements += 1
            tag = (cursor.statusmessage or "").split(" ", 1)[0].upper()
            if tag in _CHANGES:
                changed += max(cursor.rowcount, 0)
            if not cursor.nextset():
                return statements, changed

    def fence(self, run_id: str) -> int | None:
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (run_id,))
        found = self.conn.execute(
            f"SELECT max(fencing_token) FROM {self.table} WHERE run_id = %s", (run_id,)
        ).fetchone()
        return None if found is None or found[0] is None else int(found[0])

    def insert(self, row: Row) -> float:
        done = self.conn.execute(
            f"INSERT INTO {self.table} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, "
            "extract(epoch from clock_timestamp())::float8, %s) RETURNING committed_at",
            (*row[:6], row.fencing_token),
        ).fetchone()
        return float(done[0])

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def classify(self, exc: BaseException) -> Failure:
        if self.conn.closed or self.conn.broken:
            return "connection"
        state = getattr(exc, "sqlstate", None) or ""
        # 40xxx: serialization failure, deadlock (rolled back, a retry may pass);
        # 55P03: lock_timeout.
        if state.startswith("40") or state == "55P03":
            return "retry"
        return "statement"


def _row(values: Any) -> Row:
    op, digest, run_id, step, kind, result, at, token = values
    return Row(
        str(op),
        str(digest),
        str(run_id),
        str(step),
        str(kind),
        str(result),
        float(at),
        None if token is None else int(token),
    )
