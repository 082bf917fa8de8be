"""The multi-host store: a ledger in a PostgreSQL schema, through psycopg 3 and a pool.

Same port, same semantics and same errors as the SQLite store: every method is one
transaction, a journal append and the run's status change land together or not at all,
and a taken or out-of-order seq raises StaleLeaseError with nothing kept. The ledger
lives in its own schema (``crashproof`` by default), so it can share a database with an
application. Opening never writes before the schema has been recognised as absent,
empty, or a crashproof ledger this version can read; migrations run in one transaction
under an advisory lock, so processes opening a new ledger at once do not race.

Journal appends (one round trip each in the common case) are in store/pg_append.py, a
batch of many runs' in store/pg_batch.py, the run index and lease listings in
store/pg_index.py.
A run's start and lease are one statement each (create_runs, claim_leases,
release_leases), shared by the runs that start, claim or release at the same time
(store/combining.py): an event loop of async drives starts hundreds at once.
Only the PostgreSQL modules import psycopg: ``import crashproof`` works without it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool

from crashproof.errors import (
    IntegrityError,
    LedgerError,
    NotALedger,
    RunNotFound,
    SchemaTooNew,
    StaleLeaseError,
)
from crashproof.journal.records import Event, RunRow, RunStatus, request_sha256
from crashproof.store.combining import Combiner
from crashproof.store.intents import IntentHold, raw_change
from crashproof.store.migrate import check_automatic, split_statements
from crashproof.store.migrate_postgres import lock_key
from crashproof.store.pg_append import apply_change, as_columns, reason_in
from crashproof.store.pg_batch import PostgresBatchAppend
from crashproof.store.pg_connection import check_connection, parse_url, translated_errors
from crashproof.store.pg_index import PostgresIndex, run_row
from crashproof.store.port import (
    GENESIS,
    VERSION_FRESH,
    Lease,
    LedgerClock,
    RecordSealer,
    blob_digest,
    check_claimable,
    lease_was_live,
    unreadable,
    without_result,
)
from crashproof.store.queue import Claimed
from crashproof.store.request_texts import kept_form, kept_text
from crashproof.store.sql import load_migrations, load_queries, load_schema

__all__ = ["PostgresStore"]

_QUERIES = load_queries("postgres") | load_queries("postgres", "queue.sql")
_MIGRATIONS = load_migrations("postgres")
SCHEMA_VERSION = _MIGRATIONS[-1].version
# "output": ordinary commits with synchronous_commit off, those before an output with it on
# (a synchronous commit flushes the server's WAL up to it, every earlier commit included).
_SYNCHRONOUS = {"output": "off", "full": "on", "normal": "off"}
# Plain lower-case identifiers only: they need no quoting rules beyond double quotes.
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

Cursor = psycopg.Cursor[tuple[Any, ...]]
# A journal record exactly as stored: seq, type, key, payload text, value text (wherever
# kept), created_at, key_id, mac. Used by checkpoint export/import only.
RawRecord = tuple[int, str, str | None, str, str | None, float, str | None, str | None]


class PostgresStore(PostgresBatchAppend, PostgresIndex):
    """A ledger in one schema of a PostgreSQL database. Thread-safe (a connection pool).

    ``url``: ``postgresql://user:password@host:port/dbname`` (or ``postgres://``), with
    any libpq parameters, plus an optional ``schema=NAME`` (default ``crashproof``) and
    ``pool_size=N``: the connections concurrent runs share (default 4; a worker with a
    higher ``--concurrency`` may want as many); ``witness_url=URL``, for the Ledger: where
    its generation witness lives (runtime/driving/urls.py, ``default_witness``).
    ``durability``: "output" (the default) waits for the server's disk only for
    ``append(durable=True)`` and ``sync()``, which cover every earlier commit too
    (concurrent ones share the server's WAL flush: its own group commit); "full" waits
    for each commit (``synchronous_commit`` on); "normal" never does (a server crash may
    lose the last commits, never tear one). ``sealer``: seal every record with an HMAC chain and
    verify it on every read, as the SQLite store does.
    """

    def __init__(
        self,
        url: str,
        *,
        durability: str = "output",
        schema: str | None = None,
        pool_size: int | None = None,
        connect_timeout: float = 10.0,
        sealer: RecordSealer | None = None,
    ) -> None:
        if durability not in _SYNCHRONOUS:
            raise ValueError(
                f"durability must be one of {sorted(_SYNCHRONOUS)}, not {durability!r}"
            )
        conninfo, url_schema, self.display, url_pool_size, _witness = parse_url(url)
        if pool_size is None:  # the argument wins over the URL's
            pool_size = url_pool_size or 4
        self.schema = schema or url_schema or "crashproof"
        if not _SCHEMA_NAME.match(self.schema):
            raise ValueError(
                f"schema must be a lower-case identifier ([a-z_][a-z0-9_]*), not {self.schema!r}"
            )
        quoted = f'"{self.schema}"'
        self._q = {name: sql.replace("{schema}", quoted) for name, sql in _QUERIES.items()}
        self._synchronous = _SYNCHRONOUS[durability]
        self.durability = durability
        self.clock = LedgerClock(time.time, server=True)
        self._sealer = sealer
        self._init_ends()  # where each run's journal ends, as last read or written
        self._version = (0, -VERSION_FRESH)  # schema_version(): (version, when read)
        # Runs that start, claim and release at the same time share one statement each
        # (store/combining.py): a hundred async drives on one loop do so at once.
        self._getting = Combiner(self._get_many)
        self._creating = Combiner(self._create_many)
        self._claiming = Combiner(self._claim_many)
        self._releasing = Combiner(self._release_many)
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(connect_timeout)),
            # The texts go out and come back as UTF-8 whatever PGCLIENTENCODING says: in
            # SQL_ASCII psycopg returned bytes where text was read (no run could start).
            "client_encoding": "UTF8",
        }
        with self._errors(opening=True), psycopg.connect(conninfo, **kwargs) as conn:
            self._open(conn)
            # A SET LOCAL costs a round trip per transaction: skip it when the server's
            # default for this role and database is already the wanted setting.
            found = conn.execute("SHOW synchronous_commit").fetchone()
        self._server_synchronous = found[0] if found else None
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs=kwargs,
            # A connection the server dropped (restart, idle timeout) is replaced on
            # checkout, not handed to a journal commit.
            check=check_connection,
            timeout=connect_timeout,
            open=False,
            name=f"crashproof:{self.schema}",
        )
        try:
            with self._errors(opening=True):
                self._pool.open(wait=True, timeout=connect_timeout)
        except BaseException:
            self._pool.close()
            raise

    # -- opening -----------------------------------------------------------

    def _open(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        current = self._recognise(conn.cursor())
        if current == SCHEMA_VERSION:
            return  # the common case: nothing to write
        encoding = conn.info.parameter_status("server_encoding")
        if not current and encoding not in (None, "UTF8"):
            # A ledger keeps whatever text its runs meet (a model's reply in any script):
            # in LATIN1 a reply in Japanese would be refused at every resume, a run lost.
            raise LedgerError(
                f"{self.display}: the database's encoding is {encoding}, and a ledger needs "
                "UTF8 to keep every text its runs meet; nothing was written. Create the "
                "database with ENCODING 'UTF8' (CREATE DATABASE name ENCODING 'UTF8' "
                "TEMPLATE template0) and point the URL at it"
            )
        with conn.transaction():
            cur = conn.cursor()
            # Held until commit: a second opener waits here, then finds the work done.
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.schema),))
            current = self._recognise(cur)
            if current == SCHEMA_VERSION:
                return  # another process migrated it meanwhile
            cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            cur.execute(f'SET LOCAL search_path TO "{self.schema}"')
            if current:  # only a purely additive migration runs on open (store/migrate.py)
                check_automatic(cur, current, f"{self.display}?schema={self.schema}", _MIGRATIONS)
            if not current:  # a new ledger: schema.sql, equal to all migrations (tested)
                cur.execute(load_schema("postgres"))
            for migration in _MIGRATIONS[current:]:
                if current and split_statements(migration.sql):  # (some are only a number)
                    cur.execute(migration.sql)
                cur.execute(
                    self._q["record_migration"], (migration.version, migration.name, time.time())
                )
            cur.execute(self._q["set_meta"], ("schema_version", str(SCHEMA_VERSION)))

    def _recognise(self, cur: Cursor) -> int:
        """The ledger's schema version, 0 if there is none yet; refuse anything else."""
        tables = [row[0] for row in cur.execute(self._q["list_tables"], (self.schema,))]
        if not tables:
            return 0
        if "crashproof_meta" not in tables:
            raise NotALedger(
                f"schema {self.schema!r} of {self.display} holds tables that are not a "
                f"crashproof ledger ({', '.join(tables[:5])}); nothing was changed. "
                "Use another database, or another schema with ?schema=NAME."
            )
        found = self._read_version(cur)
        if found > SCHEMA_VERSION:
            too_new = SchemaTooNew(found, SCHEMA_VERSION)
            too_new.args = (f"{self.display} (schema {self.schema!r}): {too_new}",)
            raise too_new
        return found

    def _read_version(self, cur: Cursor) -> int:
        row = cur.execute(self._q["get_meta"], ("schema_version",)).fetchone()
        if row is None or not str(row[0]).isdigit():
            raise IntegrityError(
                f"{self.display} (schema {self.schema!r}): the ledger's schema version is "
                "missing or invalid"
            )
        return int(row[0])

    # -- the port ----------------------------------------------------------

    def schema_version(self) -> int:
        # One round trip of five at a run's start, saved (store/port.py: VERSION_FRESH).
        read, at = self._version
        if time.monotonic() - at < VERSION_FRESH:
            return read
        with self._read() as cur:
            found = self._read_version(cur)
        self._version = (found, time.monotonic())
        return found

    def create_run(self, row: RunRow, first: Event, lease: Lease | None = None) -> RunRow | None:
        # One statement, one round trip, shared by the runs starting at the same time
        # (queries.sql, create_runs): a transaction of BEGIN, SET LOCAL, two inserts and
        # COMMIT took five round trips a run. ``lease``: the new run held under it.
        params, mac = self._record_params(first, GENESIS)
        params.update(
            run_id=row.run_id,
            workflow=row.workflow,
            version=row.version,
            state=row.status.value,  # (not "status": the arrays are named by adding "s")
            reason=reason_in(row.reason),
            input_digest=row.input_digest,
            created=row.created_at,
            updated=row.updated_at,
        )
        params["owner"], params["ttl"], params["token"] = _held(lease)
        found = self._creating(row.run_id, params)
        if found is None:
            raise LedgerError(f"{self.display}: creating run {row.run_id!r} returned nothing")
        if found[0]:
            self._remember(row.run_id, first.seq + 1, mac)
            return None
        if found[1] is not None:
            return run_row(found[1:])
        # Created by another transaction after this statement's snapshot: read it now.
        existing = self.get_run(row.run_id)
        if existing is None:
            raise LedgerError(f"{self.display}: run {row.run_id!r} neither created nor found")
        return existing

    def _create_many(self, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        params = as_columns(_CREATE_COLUMNS, [call for _run_id, call in calls])
        params["synchronous"] = self._wanted_synchronous(False)
        with self._read() as cur:  # autocommit: the statement is its own transaction
            rows = cur.execute(self._q["create_runs"], params, prepare=True).fetchall()
        return {found[0]: found[1:] for found in rows}

    def get_run(self, run_id: str) -> RunRow | None:
        found = self._getting(run_id, None)  # shared with concurrent reads (get_runs)
        return None if found is None else run_row(found)

    def _get_many(self, calls: list[tuple[str, None]]) -> dict[str, Any]:
        with self._read() as cur:
            rows = cur.execute(
                self._q["get_runs"], {"run_ids": [run_id for run_id, _ in calls]}, prepare=True
            ).fetchall()
        return {found[0]: found for found in rows}

    def list_runs(self, status: RunStatus | None = None) -> list[RunRow]:
        with self._read() as cur:
            if status is None:
                rows = cur.execute(self._q["list_runs"]).fetchall()
            else:
                rows = cur.execute(self._q["list_runs_by_status"], (status.value,)).fetchall()
        return [run_row(r) for r in rows]

    def load_events(self, run_id: str, *, results: bool = True) -> list[Event]:
        stored = self.raw_events(run_id)
        make = Event.read if results else without_result
        try:
            if self._sealer is not None:
                # Every record verified before anything parses it, and built in the same
                # pass; payloads stay text until read (Event.read), as the SQLite store's.
                return self._sealer.verify_rows(run_id, stored, make)
            return [
                make(run_id, seq, type_, key, payload, created_at, value)
                for seq, type_, key, payload, value, created_at, _key_id, _mac in stored
            ]
        except KeyError:  # verified (or unsealed), but of a type this version does not know
            raise unreadable(run_id, stored) from None

    def claim(
        self, run_id: str, owner: str, ttl_seconds: float, *, take_over: bool | str = False
    ) -> Lease:
        # One statement, one round trip, shared by concurrent claims (queries.sql,
        # claim_leases): the transaction of BEGIN, SET LOCAL, lock-and-read, update and
        # COMMIT took five round trips a claim.
        found = self._claiming(run_id, (owner, float(ttl_seconds), take_over))
        if found is None or not found[0]:
            raise RunNotFound(f"no run {run_id!r} in ledger {self.display}")
        _exists, held_by, expires_at, now, token, until = found
        if token is None:  # not taken, nothing written: the claim rule says why
            check_claimable(run_id, held_by, expires_at, now, owner, take_over)
            raise LedgerError(  # the statement and the rule disagree: a bug, nothing written
                f"run {run_id!r}: the claim statement refused a lease the claim rule allows "
                f"(held by {held_by!r} until {expires_at!r}, server clock {now!r})"
            )
        live = lease_was_live(held_by, expires_at, now, owner)
        return Lease(owner, int(token), float(until), ttl_seconds, held_by, live)

    def _claim_many(self, calls: list[tuple[str, tuple[str, float, bool | str]]]) -> dict[str, Any]:
        params = {
            "run_ids": [run_id for run_id, _ in calls],
            "owners": [owner for _, (owner, _ttl, _take) in calls],
            "ttls": [ttl for _, (_owner, ttl, _take) in calls],
            "take_overs": [take is True for _, (_owner, _ttl, take) in calls],
            # A take-over from one holder (found gone): taken only while it still holds.
            "take_froms": [
                take if isinstance(take, str) else None for _, (_owner, _ttl, take) in calls
            ],
            # Durable (in "output" durability too): a claim a crash lost would hand its
            # fencing token out again, to the next claimant, while the first one's drive
            # goes on holding it (#38: "token 1 is superseded by 0" after a restart).
            "synchronous": self._wanted_synchronous(True),
        }
        with self._read() as cur:  # autocommit: the statement is its own transaction
            rows = cur.execute(self._q["claim_leases"], params, prepare=True).fetchall()
        return {found[0]: found[1:] for found in rows}

    def renew(self, run_id: str, lease: Lease) -> Lease:
        synchronous = self._wanted_synchronous(False)
        with self._read() as cur:  # one statement in autocommit: one round trip
            renewed = cur.execute(
                self._q["renew_lease"],
                (float(lease.ttl_seconds), run_id, lease.owner, lease.token, synchronous),
                prepare=True,
            ).fetchone()
        if renewed is None:
            raise StaleLeaseError(
                f"run {run_id!r}: the lease of worker {lease.owner} (fencing token "
                f"{lease.token}) is no longer current; another worker owns the run"
            )
        return Lease(lease.owner, lease.token, float(renewed[0]), lease.ttl_seconds)

    def renew_many(self, leases: Sequence[tuple[str, Lease]]) -> dict[str, Lease]:
        """``renew`` of several runs' leases in one statement and one round trip: the
        leases renewed, by run id (one missing: its owner or token is no longer current)."""
        params = {
            "run_ids": [run_id for run_id, _ in leases],
            "owners": [lease.owner for _, lease in leases],
            "tokens": [lease.token for _, lease in leases],
            "ttls": [float(lease.ttl_seconds) for _, lease in leases],
            "synchronous": self._wanted_synchronous(False),
        }
        with self._read() as cur:  # autocommit: one statement, one round trip
            rows = cur.execute(self._q["renew_leases"], params, prepare=True).fetchall()
        given = dict(leases)
        return {
            run_id: Lease(
                given[run_id].owner, given[run_id].token, float(expires), given[run_id].ttl_seconds
            )
            for run_id, expires in rows
        }

    def release(self, run_id: str, lease: Lease) -> None:
        self._releasing(run_id, (lease.owner, lease.token))  # shared: release_leases

    def _release_many(self, calls: list[tuple[str, tuple[str, int]]]) -> dict[str, Any]:
        params = {
            "run_ids": [run_id for run_id, _ in calls],
            "owners": [owner for _, (owner, _token) in calls],
            "tokens": [token for _, (_owner, token) in calls],
            "synchronous": self._wanted_synchronous(False),
        }
        with self._read() as cur:  # autocommit: one statement, one round trip
            rows = cur.execute(self._q["release_leases"], params, prepare=True).fetchall()
        return {found[0]: True for found in rows}

    # -- checkpoints (export/import), beyond the port ----------------------

    @property
    def sealer(self) -> RecordSealer | None:
        return self._sealer

    def load_requests(self, run_id: str) -> dict[int, str]:
        with self._read() as cur:
            rows = cur.execute(self._q["load_requests"], (run_id,)).fetchall()
        return {seq: kept_text(text) for seq, text in rows}

    def request_digests(self, run_id: str) -> dict[int, str]:
        """Each kept request's SHA-256 by record seq, for ``crashproof check``: the rows
        streamed (one in memory at a time) and hashed here, not by the server."""
        with self._read() as cur:
            rows = cur.stream(self._q["load_requests"], (run_id,))
            return {seq: request_sha256(kept_text(text)) for seq, text in rows}

    def raw_events(self, run_id: str) -> list[RawRecord]:
        """The run's records exactly as stored (not verified: the caller verifies)."""
        with self._read() as cur:
            rows = cur.execute(self._q["load_events"], (run_id,)).fetchall()
        records: list[RawRecord] = []
        for seq, type_, key, payload, value, blob, created_at, key_id, mac in rows:
            if blob is not None and value is None:
                raise IntegrityError(f"run {run_id!r} event {seq}: blob {blob} is missing")
            records.append((seq, type_, key, payload, value, created_at, key_id, mac))
        if records:  # committed records: the next append goes on from the last one
            self._remember(run_id, records[-1][0] + 1, records[-1][7])
        return records

    def install_run(
        self, row: RunRow, records: Sequence[RawRecord], requests: Mapping[int, str]
    ) -> bool:
        """Insert ``row`` and its already-sealed records, and the request texts kept
        beside them (by seq), in one transaction, unless the run exists (then nothing is
        written and False is returned)."""
        with self._transaction() as cur:
            head = (row.run_id, row.workflow, row.version, row.status.value, reason_in(row.reason))
            tail = (row.input_digest, row.created_at, row.updated_at, *_held(None))
            cur.execute(self._q["insert_run"], (*head, *tail))
            if cur.rowcount == 0:
                return False
            blobs, rows = [], []
            for seq, type_, key, payload, value, created_at, key_id, mac in records:
                blob = blob_digest(value)
                if blob is not None:
                    blobs.append((blob, value))
                    value = None
                stored = (seq, type_, key, payload, value, blob, created_at, key_id, mac)
                rows.append((row.run_id, *stored))
            if blobs:
                cur.executemany(self._q["insert_blob"], blobs)
            cur.executemany(self._q["insert_event"], rows)
            if requests:
                kept = [(row.run_id, seq, kept_form(text)) for seq, text in requests.items()]
                cur.executemany(self._q["insert_request"], kept)
            for _seq, type_, key, payload, _v, created_at, *_ in records:
                change = raw_change(type_, key, payload, created_at)
                if change is not None:  # what the run holds unresolved, as it held it
                    apply_change(cur, self._q, row.run_id, change, check=False)
            return True

    def now(self) -> float:
        # The server's clock: one clock for every host of the ledger (never the hosts').
        with self._read() as cur:
            row = cur.execute(self._q["clock_now"]).fetchone()
        if row is None:
            raise LedgerError("the PostgreSQL server returned no time for clock_timestamp()")
        return self.clock.server(float(row[0]))

    def unresolved_intents(self, run_id: str | None = None) -> list[IntentHold]:
        with self._read() as cur:
            rows = cur.execute(self._q["unresolved_intents"]).fetchall()
        return [IntentHold(*r) for r in rows if run_id is None or r[0] == run_id]

    def close(self) -> None:
        self._pool.close()

    # -- the work queue (crashproof.store.queue) ------------------------------

    def claim_next(
        self,
        owner: str,
        ttl_seconds: float,
        runnable: Sequence[str],
        *,
        exclude: Sequence[str] = (),
    ) -> Claimed | None:
        params = {
            "owner": owner,
            "ttl": float(ttl_seconds),
            "runnable": list(runnable),
            "exclude": list(exclude),
        }
        # SELECT ... FOR UPDATE SKIP LOCKED, then claim; durable as ``claim`` (a poll that
        # claims nothing writes nothing, so its commit waits for no disk).
        with self._transaction(durable=True) as cur:
            found = cur.execute(self._q["claim_next"], params).fetchone()
        if found is None:
            return None
        run_id, token, expires_at, previous, retry = found
        lease = Lease(owner, int(token), float(expires_at), ttl_seconds, previous)
        return Claimed(run_id, lease, previous, int(retry))

    def schedule_retry(self, run_id: str, delay: float, retries: int) -> float | None:
        params = {"run_id": run_id, "delay": float(delay), "retries": int(retries)}
        with self._transaction() as cur:
            found = cur.execute(self._q["schedule_retry"], params).fetchone()
        return None if found is None else float(found[0])

    # -- internals ---------------------------------------------------------

    def sync(self) -> None:
        if self.durability != "output":
            return  # "full" waited for every commit already; "normal" never forces
        with self._transaction(durable=True) as cur:
            # The commit flushes the WAL only if the transaction wrote some: a transaction
            # id alone (txid_current(), as before) writes none, so its synchronous commit
            # flushed nothing and a crash then lost every commit this was to cover (#38:
            # an enqueued run gone). A transactional logical message is WAL of its own,
            # allowed to any role, at any wal_level, and read by no one but a decoder.
            cur.execute("SELECT pg_logical_emit_message(true, 'crashproof.sync', '')")

    def _wanted_synchronous(self, durable: bool) -> str:
        """The ``synchronous_commit`` a transaction needs ("on" for an output point in
        "output" mode)."""
        return "on" if durable and self.durability == "output" else self._synchronous

    def _synchronous_for(self, durable: bool) -> str | None:
        """The setting a transaction must SET LOCAL, or None when the server's default
        already is it: a SET LOCAL costs a round trip per transaction."""
        wanted = self._wanted_synchronous(durable)
        return None if wanted == self._server_synchronous else wanted

    @contextlib.contextmanager
    def _transaction(self, *, durable: bool = False) -> Iterator[Cursor]:
        with self._errors(), self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor()
            setting = self._synchronous_for(durable)
            if setting is not None:
                cur.execute(f"SET LOCAL synchronous_commit TO {setting}")
            yield cur

    @contextlib.contextmanager
    def _read(self) -> Iterator[Cursor]:
        # Autocommit: each read is one statement, hence one consistent snapshot.
        with self._errors(), self._pool.connection() as conn:
            yield conn.cursor()

    def _errors(self, *, opening: bool = False) -> contextlib.AbstractContextManager[None]:
        """Turn psycopg's errors into clear crashproof ones, without a driver traceback."""
        return translated_errors(f"PostgreSQL ledger {self.display}", self.schema, opening=opening)


# The columns of create_runs (as_columns).
_CREATE_COLUMNS = (
    "run_id",
    "workflow",
    "version",
    "state",
    "reason",
    "input_digest",
    "created",
    "updated",
    "seq",
    "type",
    "key",
    "payload",
    "value",
    "blob",
    "data",
    "created_at",
    "key_id",
    "mac",
    "owner",
    "ttl",
    "token",
)


def _held(lease: Lease | None) -> tuple[str | None, float | None, int]:
    """insert_run's owner, ttl and fencing token: a new run held under ``lease``, or not."""
    if lease is None:
        return None, None, 0
    return lease.owner, float(lease.ttl_seconds), lease.token
