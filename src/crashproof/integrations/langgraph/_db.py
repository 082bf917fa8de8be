"""CrashproofSaver's tables, in the ledger's own database: one connection, two dialects.

The SQL is written once with ``?`` placeholders (SQLite's; PostgreSQL's ``%s`` is
substituted) and upserts every supported SQLite and PostgreSQL accept alike. A write
transaction holds the thread's head row exclusively (SQLite ``BEGIN IMMEDIATE``,
PostgreSQL ``SELECT ... FOR UPDATE``); a read transaction sees one snapshot.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import crashproof as cp

__all__ = ["Database", "Query", "open_database"]

Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]

_TABLES = (
    """CREATE TABLE IF NOT EXISTS {s}langgraph_threads (
        thread_id TEXT PRIMARY KEY, generation BIGINT NOT NULL, latest TEXT NOT NULL,
        seal TEXT NOT NULL, owner TEXT, lease_expires DOUBLE PRECISION,
        token BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS {s}langgraph_checkpoints (
        thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
        parent_id TEXT, run_id TEXT, checkpoint TEXT NOT NULL, metadata TEXT NOT NULL,
        seal TEXT NOT NULL, PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id))""",
    """CREATE INDEX IF NOT EXISTS langgraph_checkpoints_run
        ON {s}langgraph_checkpoints (run_id)""",
    """CREATE TABLE IF NOT EXISTS {s}langgraph_blobs (
        thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, channel TEXT NOT NULL,
        version TEXT NOT NULL, base_version TEXT, value TEXT, seal TEXT NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version))""",
    """CREATE TABLE IF NOT EXISTS {s}langgraph_writes (
        thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL, idx INTEGER NOT NULL, channel TEXT NOT NULL,
        task_path TEXT NOT NULL, value TEXT NOT NULL, seal TEXT NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx))""",
)


class Database:
    """One connection behind a lock (the saver is shared by a graph's threads)."""

    dialect: str

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def write(self) -> contextlib.AbstractContextManager[Query]:
        raise NotImplementedError

    def read(self) -> contextlib.AbstractContextManager[Query]:
        raise NotImplementedError

    def now(self, q: Query) -> float:
        return time.time()

    def close(self) -> None:
        raise NotImplementedError


class _SQLite(Database):
    dialect = "sqlite"

    def __init__(self, path: str, *, synchronous: str) -> None:
        super().__init__()
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        with self.write() as q:
            for ddl in _TABLES:
                q(ddl.format(s="").replace("DOUBLE PRECISION", "REAL"), ())

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[Query]:
        with self._lock:
            conn = self._conn

            def q(sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
                return conn.execute(sql, tuple(args)).fetchall()

            conn.execute(begin)
            try:
                yield q
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def write(self) -> contextlib.AbstractContextManager[Query]:
        return self._transaction("BEGIN IMMEDIATE")

    def read(self) -> contextlib.AbstractContextManager[Query]:
        return self._transaction("BEGIN")

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _Postgres(Database):
    dialect = "postgres"

    def __init__(self, conninfo: str, schema: str) -> None:
        super().__init__()
        try:  # imported here: the SQLite saver needs no psycopg
            import psycopg
        except ImportError as exc:
            raise cp.LedgerError(
                f"PostgreSQL savers need psycopg ({exc}): pip install 'crashproof[postgres]'"
            ) from None
        self._conn = psycopg.connect(conninfo, autocommit=True)
        self._schema = schema
        with self.write() as q:
            q("SELECT pg_advisory_xact_lock(7412024)", ())  # concurrent first opens
            q(f'CREATE SCHEMA IF NOT EXISTS "{schema}"', ())
            q(f'SET LOCAL search_path TO "{schema}"', ())
            for ddl in _TABLES:
                q(ddl.format(s=f'"{schema}".'), ())

    @contextlib.contextmanager
    def _transaction(self, read: bool) -> Iterator[Query]:
        with self._lock, self._conn.transaction():
            conn = self._conn
            if read:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(f'SET LOCAL search_path TO "{self._schema}"')

            def q(sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
                cur = conn.execute(sql.replace("?", "%s"), tuple(args))
                return cur.fetchall() if cur.description is not None else []

            yield q

    def write(self) -> contextlib.AbstractContextManager[Query]:
        return self._transaction(False)

    def read(self) -> contextlib.AbstractContextManager[Query]:
        return self._transaction(True)

    def now(self, q: Query) -> float:
        return float(q("SELECT extract(epoch FROM clock_timestamp())", ())[0][0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def open_database(url: str, *, synchronous: str = "FULL") -> Database:
    """The saver's tables in the database of the ledger URL ``url`` (SQLAlchemy's rule for
    ``sqlite:///``; a PostgreSQL ledger's ``?schema=S`` puts them in schema
    ``S_langgraph``, default ``crashproof_langgraph``)."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if not path or "?" in path or "#" in path:
            raise ValueError(f"a sqlite URL names a file, sqlite:///runs.db, not {url!r}")
        return _SQLite(path, synchronous=synchronous)
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
        schema = next((v for k, v in query if k == "schema"), "crashproof")
        rest = urlencode(
            [(k, v) for k, v in query if k not in ("schema", "pool_size", "witness_url")]
        )
        conninfo = urlunsplit((*parts[:3], rest, parts.fragment))
        return _Postgres(conninfo, f"{schema}_langgraph")
    raise ValueError(
        "CrashproofSaver needs a durable ledger URL: sqlite:///path.db or "
        "postgresql://user:password@host/dbname (not memory://)"
    )
