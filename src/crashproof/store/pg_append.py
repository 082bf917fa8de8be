"""Journal appends of the PostgreSQL store: one round trip in the common case.

A mixin of ``PostgresStore``. The store remembers, per run, where the journal ends (the
next seq and the last record's MAC) from what it read or wrote itself. With that, an
append is one statement, ``append_events`` in queries.sql, sent in autocommit (its own
transaction, one round trip) and enforcing in SQL everything the read-then-write used to
check in Python: the run's row is locked and its fencing token must be the writer's
(a claim waits for the commit, or the append is refused), the previous record must be
there with the remembered MAC, and the primary key (run_id, seq) refuses a taken seq.
Blobs and the run's status change go in the same statement (data-modifying CTEs), so
they land with the records or not at all; the statement also sets its own transaction's
``synchronous_commit`` (``set_config(..., true)``), so an output point waits for the
disk and other commits do not, without a BEGIN/SET LOCAL round trip.

Whenever the statement refuses (no row written, or a taken seq) or nothing is known
about the run, the append falls back to the checked path: lock the run's row, read the
journal's end, compare, write, in two round trips. That path raises the same clear
errors as always (StaleLeaseError: taken over, seq taken, no such run) or succeeds
when only the remembered end was out of date. Nothing of a refused write is kept.

Many runs' records in one transaction (``append_batch``): ``pg_batch.py``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool

from crashproof.errors import StaleLeaseError
from crashproof.journal.codec import encode
from crashproof.journal.records import Event
from crashproof.store.intents import Change, IntentHold, change_of, held, others, touches
from crashproof.store.port import (
    GENESIS,
    RecordSealer,
    StatusChange,
    blob_digest,
    check_append,
    seq_taken,
)
from crashproof.store.request_texts import kept_form

__all__ = ["EVENT_COLUMNS", "PostgresAppend", "apply_change", "as_columns", "reason_in"]

Cursor = psycopg.Cursor[tuple[Any, ...]]
# Journal ends remembered at most: a worker drives a few runs at a time; the oldest entry
# goes first (forgetting one only costs its next append the checked path).
_MAX_ENDS = 4096


class PostgresAppend:
    """The journal-append half of PostgresStore (see the module docstring)."""

    _q: dict[str, str]
    _pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]]
    _sealer: RecordSealer | None
    display: str

    def _errors(self, *, opening: bool = False) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError  # provided by PostgresStore

    def _synchronous_for(self, durable: bool) -> str | None:
        raise NotImplementedError  # provided by PostgresStore

    def _wanted_synchronous(self, durable: bool) -> str:
        raise NotImplementedError  # provided by PostgresStore

    # run id -> (next seq, the last record's stored MAC): facts about committed records,
    # which never change; a wrong entry only makes the statement refuse.
    _ends: dict[str, tuple[int, str | None]]
    _ends_lock: threading.Lock

    def _init_ends(self) -> None:
        self._ends = {}
        self._ends_lock = threading.Lock()

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
        with self._ends_lock:
            known = self._ends.pop(run_id, None)  # back in only once this append landed
        if (
            known is not None
            and known[0] == events[0].seq
            and not any(touches(e) for e in events)  # an act's intent or end: the index too
            and (len(events) == 1 or all(e.request_text is None for e in events))
            and self._append_one_trip(events, status, fencing_token, durable, known[1])
        ):
            return
        self._append_checked(events, status, fencing_token, durable)

    def _remember(self, run_id: str, next_seq: int, mac: str | None) -> None:
        with self._ends_lock:
            self._ends.pop(run_id, None)
            self._ends[run_id] = (next_seq, mac)
            if len(self._ends) > _MAX_ENDS:
                del self._ends[next(iter(self._ends))]

    def _append_one_trip(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        fencing_token: int | None,
        durable: bool,
        prev_mac: str | None,
    ) -> bool:
        """The one-statement append; False when the statement refused it (nothing was
        written: the caller takes the checked path, which says why)."""
        run_id, first = events[0].run_id, events[0].seq
        if any(e.run_id != run_id or e.seq != first + i for i, e in enumerate(events)):
            return False  # the checked path refuses it with the usual message
        query, params, mac = self._one_trip_params(
            events, status, fencing_token, self._wanted_synchronous(durable), prev_mac
        )
        request = events[0].request_text
        with self._errors(), self._pool.connection() as conn:
            try:
                if request is None:
                    written = conn.execute(query, params, prepare=True).rowcount
                else:
                    written = self._with_request(conn, query, params, request)
            except psycopg.errors.UniqueViolation:
                return False  # a taken seq (another writer): the checked path raises it
        if written != len(events):
            return False
        self._remember(run_id, events[-1].seq + 1, mac)
        return True

    def _with_request(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        query: str,
        params: dict[str, Any],
        request: str,
    ) -> int:
        """The one-record statement and its request's row in one transaction, pipelined
        (one round trip, as without a request); the row is written only where the
        statement wrote its record (else the checked path decides). The rows written."""
        kept = {k: params[k] for k in ("run_id", "seq", "payload", "mac")}
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                cur = conn.execute(query, params, prepare=True)
                conn.execute(self._q["insert_request_after"], {**kept, "text": kept_form(request)})
                conn.execute("COMMIT")
        finally:  # refused, or a statement failed: never pool an open transaction
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):  # a broken one is discarded
                    conn.rollback()
        return cur.rowcount

    def _record_params(self, event: Event, prev_mac: str) -> tuple[dict[str, Any], str | None]:
        """One record as the one-record statements take it (its columns after the run id,
        ``data``: its blob's text or None) and its MAC, chained to ``prev_mac``."""
        blobs, rows, mac = self._rows((event,), prev_mac)
        params: dict[str, Any] = dict(zip(EVENT_COLUMNS, rows[0][1:], strict=True))
        params["data"] = blobs[0][1] if blobs else None
        return params, mac

    def _one_trip_params(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        fencing_token: int | None,
        synchronous: str,
        prev_mac: str | None,
    ) -> tuple[str, dict[str, Any], str | None]:
        """The one-statement append of ``events`` (one run's, contiguous) after
        ``prev_mac``: (query, parameters, the last record's MAC)."""
        blobs, rows, mac = self._rows(events, prev_mac or GENESIS)
        params: dict[str, Any] = {
            "run_id": events[0].run_id,
            "token": fencing_token,
            "prev_mac": prev_mac,
            "synchronous": synchronous,
            "status": None if status is None else status[0].value,
            "reason": None if status is None else reason_in(status[1]),
            "now": time.time(),
        }
        if len(rows) == 1:  # nearly every append: plain parameters, encoded fast
            query = self._q["append_event"]
            params.update(zip(EVENT_COLUMNS, rows[0][1:], strict=True))
            params["data"] = blobs[0][1] if blobs else None
        else:
            query = self._q["append_events"]
            params["first"] = events[0].seq
            params["digests"] = [b[0] for b in blobs]
            params["datas"] = [b[1] for b in blobs]
            for i, column in enumerate(EVENT_COLUMNS, start=1):  # [0] is the run id
                params[f"{column}s"] = [row[i] for row in rows]
        return query, params, mac

    def _append_checked(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        fencing_token: int | None,
        durable: bool,
    ) -> None:
        run_id = events[0].run_id
        with self._pipelined(durable=durable) as cur:
            # The primary key only refuses a taken seq; a gap, a reorder or a missing run
            # would slip through it, so check the batch against the journal's end first.
            # journal_end locks the run's row: a claim cannot slip in before the commit.
            found = cur.execute(self._q["journal_end"], (run_id,)).fetchone()
            found = check_append(run_id, self.display, found, fencing_token, events)
            for event in events:  # the index of unresolved intents, in the same transaction
                change = change_of(event)
                if change is not None:
                    apply_change(cur, self._q, run_id, change, check=True)
            mac = self._insert_events(cur, events, found[1] or GENESIS)
            if status is not None:
                cur.execute(
                    self._q["set_status"],
                    {
                        "status": status[0].value,
                        "reason": reason_in(status[1]),
                        "now": time.time(),
                        "run_id": run_id,
                    },
                )
        self._remember(run_id, events[-1].seq + 1, mac)

    def _rows(
        self, events: Sequence[Event], prev_mac: str
    ) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]], str | None]:
        """(blobs, event rows as stored, the last record's MAC): sealed over exactly the
        bytes stored, each record chained to the one before."""
        blobs, rows = [], []
        mac: str | None = None
        for event in events:
            # The text as built (Event.payload_text), else codec.encode: the one encoder.
            payload, type_ = event.payload_text, event.type._value_
            key_id = mac = None
            if self._sealer is not None:
                key_id, mac = self._sealer.seal(
                    event.run_id,
                    event.seq,
                    type_,
                    event.key,
                    payload,
                    event.value_json,
                    event.created_at,
                    prev_mac,
                )
                prev_mac = mac
            value = event.value_json
            blob = blob_digest(value)
            if blob is not None and value is not None:
                blobs.append((blob, value))
                value = None
            head = (event.run_id, event.seq, type_, event.key, payload)
            rows.append((*head, value, blob, event.created_at, key_id, mac))
        return blobs, rows, mac

    def _insert_events(self, cur: Cursor, events: Sequence[Event], prev_mac: str) -> str | None:
        """Insert the sealed records; returns the last one's MAC."""
        blobs, rows, mac = self._rows(events, prev_mac)
        try:
            # One row (the common case): execute, one round trip; executemany would
            # enter pipeline mode and wait for its syncs.
            for query, params in ((self._q["insert_blob"], blobs), (self._q["insert_event"], rows)):
                if len(params) == 1:
                    cur.execute(query, params[0])
                elif params:
                    cur.executemany(query, params)
            requests = [
                (e.run_id, e.seq, kept_form(t)) for e in events if (t := e.request_text) is not None
            ]
            if requests:  # beside their records, in the same transaction
                cur.executemany(self._q["insert_request"], requests)
        except psycopg.errors.UniqueViolation:
            raise seq_taken(events[0]) from None
        return mac

    @contextlib.contextmanager
    def _pipelined(self, *, durable: bool = False) -> Iterator[Cursor]:
        """One transaction in pipeline mode: BEGIN travels with the first query whose
        result is fetched, the writes that follow travel with COMMIT (two round trips;
        psycopg's transaction() would add a sync of its own)."""
        with self._errors(), self._pool.connection() as conn:
            try:
                with conn.pipeline():
                    cur = conn.cursor()
                    cur.execute("BEGIN")
                    setting = self._synchronous_for(durable)
                    if setting is not None:
                        cur.execute(f"SET LOCAL synchronous_commit TO {setting}")
                    # A refusal raised here leaves the transaction open: the rollback
                    # below ends it. Not a ROLLBACK queued in the pipeline: psycopg then
                    # empties its cache of prepared statements but deallocates them on
                    # the server only at the connection's next statement, after it
                    # prepared that one again, which the next use then misses ("prepared
                    # statement does not exist"). conn.rollback() deallocates at once.
                    yield cur
                    cur.execute("COMMIT")
            except psycopg.errors.UniqueViolation:  # a queued insert, raised at the sync
                raise StaleLeaseError(
                    "a journal sequence is already taken; another writer is appending to "
                    "this run. Nothing of this write was kept."
                ) from None
            finally:  # a statement failed inside the pipeline: never pool an open transaction
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):  # a broken one is discarded
                        conn.rollback()


# The event columns after the run id, in the order of _rows: the parameters of
# append_event, and (plural, as unnest() arrays) of append_events.
EVENT_COLUMNS = ("seq", "type", "key", "payload", "value", "blob", "created_at", "key_id", "mac")


def as_columns(names: Sequence[str], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``rows`` (one dict of parameters each, one per run) as the parameters of a rows
    statement: an array per column, named by adding "s" (``seq`` -> ``seqs``)."""
    return {f"{name}s": [row[name] for row in rows] for name in names}


def apply_change(
    cur: Cursor, queries: dict[str, str], run_id: str, change: Change, *, check: bool
) -> None:
    """Apply one record's change to the index of unresolved intents (store/intents.py);
    ``check``: refuse a new hold another run has (IntentHeld), else install it as it is."""
    if change.what == "end":
        cur.execute(queries["release_run_intents"], (run_id,))
    elif change.what == "release":
        cur.execute(queries["release_intent"], (run_id, change.key))
    else:
        if check:
            # Two runs' transactions would both see no holder and both hold it: one
            # waits for the other's commit here, then sees its hold.
            cur.execute(queries["lock_intent"], (change.digest,))
            rows = cur.execute(
                queries["intent_holds"], (run_id, change.key, change.digest, change.instance)
            ).fetchall()
            refusing = others((IntentHold(*row) for row in rows), run_id, change)
            if refusing:
                raise held(run_id, change.key, refusing)
        cur.execute(
            queries["hold_intent"],
            (run_id, change.key, change.digest, change.instance, change.since),
        )


def reason_in(reason: str | None) -> str | None:
    # A JSON string, so that NUL and lone surrogates (which a text column refuses) come
    # back exactly; everything else stays readable in psql.
    return None if reason is None else encode(reason, what="a reason")
