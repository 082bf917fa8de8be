"""The generation witness of a PostgreSQL ledger, in a schema of its own.

A restore of the ledger's schema (``pg_restore`` of an older dump, a point-in-time
recovery of one schema, a careless ``UPDATE``) must not also restore the witness, so it
lives apart: by default in the schema ``<ledger schema>_witness`` of the same database,
or anywhere else through the ledger URL's ``witness_url=URL`` parameter (percent-encoded:
``postgresql://u@db1/app?witness_url=postgresql%3A%2F%2Fu%40db2%2Fwitness``), or a
``PostgresWitness`` passed as ``Ledger(..., witness=)``: another database or host, the
stronger choice, since a whole-database restore would roll both back together. The URL
parameter is the one every process that opens the ledger (workers, the CLI) follows.

Same contract as the SQLite witness (crashproof.integrity.witness): one row per run,
generations only go up except through the operator's ``reset`` (re-anchor, import).
Every write that an output point depends on (a new run's row, an advance) is durable
when it returns: its transaction commits with ``synchronous_commit = on``, set by the
statement itself (``set_config(..., true)``: no extra round trip), whatever the server's,
database's or role's default. The SQLite witness's two reasons hold here
(crashproof.integrity.witness):

- a new run's row is written before the run's first journal record. If it could be lost
  while the journal's records survive, the run would be refused as ``WitnessMissing``
  though its journal is good (a run nobody but an operator's ``reanchor`` can mend);
- an advance stands for an output that is about to leave the process; lost, it would
  leave the witness at an older output point, and a journal copy restored to between
  the two would pass the check and repeat the later effects.

A witness on another server (``witness_url``, the stronger choice) has a WAL of its own:
written unsynced, a crash of that server lost the rows of the runs started in its last
fraction of a second while the ledger kept their records; in the ledger's own cluster it
happened too, more rarely (tests/integration/test_postgres_crash.py, #38). The cost is
one WAL flush per write; runs starting or reaching output points at once share it
(``_start_many``, ``advance_many``), and PostgreSQL's group commit shares the rest.

Only this module and the PostgreSQL store import psycopg.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import psycopg

from crashproof.errors import LedgerError
from crashproof.store.combining import Combiner
from crashproof.store.pg_connection import first_line, parse_url

__all__ = ["PostgresWitness"]

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# The connections a witness opens at most: enough for the runs of a worker or an event
# loop to start and read their journals side by side.
_CONNECTIONS = 4
_LOCK_KEY = 0x63707769746E6573  # "cpwitnes": serializes creating witness schemas
# The condition every writing statement carries: its own transaction commits durably (the
# SET LOCAL of a one-statement transaction, evaluated for each row it writes).
_DURABLE = "set_config('synchronous_commit', 'on', true) = 'on'"


class PostgresWitness:
    """Generations in ``<schema>.witness``, on a few autocommit connections (opened as
    needed): many runs starting, reading their journals and reaching output points at
    once would queue on one."""

    def __init__(self, url: str, *, schema: str, connect_timeout: float = 10.0) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(
                f"witness schema must be a lower-case identifier ([a-z_][a-z0-9_]*), not {schema!r}"
            )
        parsed = parse_url(url)
        self._conninfo, self.display = parsed.conninfo, parsed.display
        self._connect_timeout = max(1, round(connect_timeout))
        self.schema = schema
        self._table = f'"{schema}".witness'
        self._lock = threading.Lock()
        # Advances asked for and not yet written (advance_many): run id -> generation;
        # the tickets of the calls asked and covered so far.
        self._asking = threading.Lock()
        self._pending: dict[str, int] = {}
        self._asked = self._written = 0
        # Idle connections (the last one used first); at most _CONNECTIONS in use.
        self._slots = threading.BoundedSemaphore(_CONNECTIONS)
        self._idle_lock = threading.Lock()
        self._closed = False
        self._starting = Combiner(self._start_many)  # runs starting at once: one statement
        first = self._connect()
        self._idle = [first]
        try:
            self._create(first)
        except BaseException:
            first.close()
            raise

    def _create(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """The schema and table, if missing; one transaction under an advisory lock, so
        processes opening a new witness at once do not race to create it."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._table} (run_id text PRIMARY KEY, "
                    "generation bigint NOT NULL CHECK (generation >= 0), "
                    "updated_at double precision NOT NULL)"
                )
        except psycopg.Error as exc:
            raise self._unusable(exc) from None

    def get(self, run_id: str) -> int | None:
        # A read: one statement in autocommit, one round trip (a transaction took four).
        row = self._execute(
            f"SELECT generation FROM {self._table} WHERE run_id = %s", (run_id,), alone=True
        )
        return None if row is None else int(row[0])

    def known(self) -> dict[str, int]:
        row = self._execute(  # one row, so one statement as every other here
            f"SELECT coalesce(json_object_agg(run_id, generation), '{{}}') FROM {self._table}",
            alone=True,
        )
        found = {} if row is None else row[0]
        return {str(run_id): int(generation) for run_id, generation in found.items()}

    def start(self, run_id: str) -> None:
        # One round trip, as advance: the set_config is the SET LOCAL of its transaction
        # (durable before the run's first record: the module docstring).
        self._execute(
            f"INSERT INTO {self._table} (run_id, generation, updated_at) "
            f"SELECT %s, 0, %s WHERE {_DURABLE} "
            "ON CONFLICT (run_id) DO NOTHING",
            (run_id, time.time()),
            alone=True,
        )

    def start_unseen(self, run_id: str) -> int | None:
        """``get`` and, when the witness never saw the run, ``start``, in one statement
        and one round trip (runtime/driving/lifecycle.py, record_starts), shared by the
        runs starting at the same time (store/combining.py): the generation held before,
        or None."""
        return self._starting(run_id, None)

    def _start_many(self, calls: list[tuple[str, None]]) -> dict[str, int]:
        row = self._execute(
            f"WITH asked AS (SELECT unnest(%s::text[]) AS run_id), "
            f"seen AS (SELECT w.run_id, w.generation FROM {self._table} AS w "
            "WHERE w.run_id IN (SELECT asked.run_id FROM asked)), "
            f"made AS (INSERT INTO {self._table} (run_id, generation, updated_at) "
            "SELECT asked.run_id, 0, %s FROM asked "
            "WHERE asked.run_id NOT IN (SELECT seen.run_id FROM seen) "
            f"AND {_DURABLE} "
            "ORDER BY asked.run_id ON CONFLICT (run_id) DO NOTHING) "
            "SELECT coalesce(json_object_agg(seen.run_id, seen.generation), '{}') FROM seen",
            ([run_id for run_id, _ in calls], time.time()),
            alone=True,
        )
        found = {} if row is None else row[0]
        return {str(run_id): int(generation) for run_id, generation in found.items()}

    def advance(self, run_id: str, generation: int) -> None:
        self.advance_many({run_id: generation})

    def advance_many(self, generations: dict[str, int]) -> None:
        """Raise several runs' generations (never lowering one); returns once a write made
        after this call began holds them. Concurrent callers combine, as the SQLite
        witness's do: whoever takes the connection next writes every advance asked so far
        in one statement, and the callers it covered return without writing (one
        connection behind a lock: many runs' output points would queue on it)."""
        with self._asking:
            pending = self._pending
            for run_id, generation in generations.items():
                if pending.get(run_id, -1) < generation:
                    pending[run_id] = generation
            self._asked = ticket = self._asked + 1
        with self._lock:
            if self._written >= ticket:
                return  # covered by the write another caller made meanwhile
            with self._asking:
                batch, self._pending = self._pending, {}
                upto = self._asked
            try:
                # One statement, its own transaction (autocommit), one round trip: the
                # act waits for it before it executes (BEGIN, SET LOCAL, UPDATE, COMMIT
                # took four). The set_config is that SET LOCAL, made by the rows it lets
                # through (an update that changes nothing commits nothing to flush): the
                # advance is durable before the output it stands for leaves.
                self._execute(
                    f"UPDATE {self._table} AS w SET generation = a.generation, updated_at = %s "
                    "FROM unnest(%s::text[], %s::bigint[]) AS a (run_id, generation) "
                    f"WHERE w.run_id = a.run_id AND w.generation < a.generation AND {_DURABLE}",
                    (time.time(), list(batch), list(batch.values())),
                    alone=True,
                )
            except BaseException:
                with self._asking:  # not written: the next caller tries these again
                    for run_id, generation in batch.items():
                        if self._pending.get(run_id, -1) < generation:
                            self._pending[run_id] = generation
                raise
            self._written = upto

    def reset(self, run_id: str, generation: int) -> None:
        self._execute(
            f"INSERT INTO {self._table} (run_id, generation, updated_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (run_id) DO UPDATE SET generation = excluded.generation, "
            "updated_at = excluded.updated_at",
            (run_id, generation, time.time()),
        )

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            return psycopg.connect(  # UTF-8 whatever PGCLIENTENCODING says, as the store's
                self._conninfo,
                autocommit=True,
                connect_timeout=self._connect_timeout,
                client_encoding="UTF8",
            )
        except psycopg.Error as exc:
            raise LedgerError(
                f"cannot open the generation witness at {self.display} (schema "
                f"{self.schema}): {first_line(exc)}"
            ) from None

    def _execute(
        self, sql: str, args: tuple[Any, ...] = (), *, alone: bool = False
    ) -> tuple[Any, ...] | None:
        """One statement in its own transaction, on an idle connection. Every statement
        here is idempotent, so a connection the server dropped (restart, idle timeout) is
        replaced and the statement tried once more."""
        with self._slots:
            with self._idle_lock:
                if self._closed:
                    raise self._unusable(RuntimeError("the witness was closed"))
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            try:
                try:
                    return self._run(conn, sql, args, alone)
                except psycopg.OperationalError as exc:
                    if not conn.broken:
                        raise self._unusable(exc) from None
                except psycopg.Error as exc:
                    raise self._unusable(exc) from None
                conn.close()
                conn = self._connect()
                try:
                    return self._run(conn, sql, args, alone)
                except psycopg.Error as exc:
                    raise self._unusable(exc) from None
            finally:
                self._put_back(conn)

    def _put_back(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        with self._idle_lock:
            if not self._closed and not conn.closed and not conn.broken:
                self._idle.append(conn)
                return
        conn.close()

    @staticmethod
    def _run(
        conn: psycopg.Connection[tuple[Any, ...]], sql: str, args: tuple[Any, ...], alone: bool
    ) -> tuple[Any, ...] | None:
        if alone:  # a read, or a statement that sets what it needs itself (autocommit)
            cursor = conn.execute(sql, args)
        else:
            with conn.transaction():
                # reset (the operator's re-anchor): durable as every write (module docstring).
                conn.execute("SET LOCAL synchronous_commit = on")
                cursor = conn.execute(sql, args)
        row: tuple[Any, ...] | None = cursor.fetchone() if cursor.description is not None else None
        return row

    def _unusable(self, exc: BaseException) -> LedgerError:
        return LedgerError(
            f"cannot use the generation witness at {self.display} (schema {self.schema}): "
            f"{first_line(exc)}"
        )

    def close(self) -> None:
        with self._idle_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
