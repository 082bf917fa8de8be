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

``append_batch`` sends many runs' one-statement appends in one pipelined transaction
(the async drives that reach a commit in the same turn: runtime/driving/batching.py):
one round trip for all, each record refused by its own checks without touching the
others'. The runs' first records share one statement (append_records: the same checks
per row, a status change and an act's or a run's end releasing its intents with its row
only, the arrays sent in binary), the others follow it one statement each. Decisions'
request texts follow them all in one statement (insert_requests_after), each written
only where its very record (payload and MAC) then is: with its record or not at all. An
act's intent (a new hold of the index of unresolved intents) goes in the batch too, its
hold checked in SQL after the intent's lock (append_event_holding); refused, it writes
nothing and the checked path after the commit says who holds it. The rows statement
locks its runs' rows (in run id order) before the statements after it lock theirs: a
transaction of another process locking the same runs in another order may meet it in a
deadlock, which PostgreSQL breaks by failing one of the two (this one: undone, its
groups go on one by one; nothing is lost).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool

from crashproof.errors import CrashproofError, StaleLeaseError
from crashproof.journal.codec import encode
from crashproof.journal.records import Event
from crashproof.store.intents import Change, IntentHold, change_of, held, others, touches
from crashproof.store.port import (
    GENESIS,
    RecordAppend,
    RecordSealer,
    StatusChange,
    blob_digest,
    check_append,
    seq_taken,
)

__all__ = ["PostgresAppend", "apply_change", "as_columns", "reason_in"]

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
                conn.execute(self._q["insert_request_after"], {**kept, "text": request})
                conn.execute("COMMIT")
        finally:  # refused, or a statement failed: never pool an open transaction
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):  # a broken one is discarded
                    conn.rollback()
        return cur.rowcount

    def append_batch(
        self, groups: Sequence[Sequence[RecordAppend]]
    ) -> list[tuple[int, Exception] | None]:
        """Several runs' records (a group per run, in order) in one transaction and one
        round trip: each record as its one-statement append (append_event), whose checks
        (the run's fencing token, the previous record with the MAC chained to) refuse it
        by writing nothing, so a refused record needs no savepoint and costs the other
        runs nothing; the records after it in its group are refused by the same chain
        check; an act's end and a run's end release their intents in their own statement
        (append_event_releasing); an act's intent, a new hold, is checked against the
        other runs' holds and held in its own statement too (append_event_holding,
        after lock_run_intent: the same rule and lock as the checked path's), written
        only when no other run holds it. The records' request texts go last, in one
        statement, each only where its record was written (insert_requests_after).
        The records the statement cannot take (nothing
        known about the run, several records that touch the index) and a group's
        records from its first refused one go on after the commit through ``append``
        (the checked path, its clear errors: IntentHeld names the holder), the groups
        side by side. Per group: None, or (index, error) of the first record not kept;
        the records before it are kept. Returns once an output point among them is durable
        (the transaction commits with synchronous_commit on then). A taken seq or a
        deadlock undoes the whole transaction (nothing kept): every group then goes
        through ``append``; an error of the transaction itself is raised for all."""
        plans = self._batch_plans(groups)
        sent = [plan for plan in plans if plan.statements]
        # One order for the runs' row locks: two batches never wait on each other in a cycle.
        sent.sort(key=lambda plan: plan.run_id)
        written: list[list[int]] | None = []
        if sent:
            durable = any(groups[p.group][i][3] for p in sent for i in range(len(p.statements)))
            written = self._batch_trip(sent, self._wanted_synchronous(durable))
            if written is None:  # nothing of the transaction was kept
                for plan in sent:
                    plan.statements.clear()
                    plan.ends.clear()
        counts = dict(zip((id(plan) for plan in sent), written or (), strict=False))
        results: list[tuple[int, Exception] | None] = [None] * len(groups)
        rest: list[tuple[int, int]] = []  # (group, its first record not yet kept)
        for plan in plans:
            kept = 0
            for count, statement in zip(counts.get(id(plan), ()), plan.statements, strict=False):
                if count != statement[2]:
                    break
                kept += 1
            if kept:
                self._remember(plan.run_id, *plan.ends[kept - 1])
            if kept < len(groups[plan.group]):
                rest.append((plan.group, kept))
        # Each run's rest in order, the runs side by side (the pool bounds them): one
        # run's checked appends (two round trips each) never wait for another's.
        if len(rest) == 1:
            g, start = rest[0]
            results[g] = self._append_rest(groups[g], start)
        elif rest:
            done = _REST.map(lambda item: self._append_rest(groups[item[0]], item[1]), rest)
            for (g, _start), result in zip(rest, done, strict=True):
                results[g] = result
        return results

    def _batch_plans(self, groups: Sequence[Sequence[RecordAppend]]) -> list[_Plan]:
        """Per group, the statements of its records' longest prefix that the one-statement
        append can take, each chained to the one before."""
        plans = []
        for g, group in enumerate(groups):
            run_id = group[0][0][0].run_id
            plan = _Plan(g, run_id)
            plans.append(plan)
            with self._ends_lock:
                known = self._ends.pop(run_id, None)  # back in only once its appends land
            if known is None:
                continue
            next_seq, prev_mac = known
            for events, status, token, _durable in group:
                if any(e.run_id != run_id or e.seq != next_seq + i for i, e in enumerate(events)):
                    break
                change = _index_change(events)
                if change is False:
                    break  # several records that touch the index: the checked path
                query: str | None
                query, params, mac = self._one_trip_params(events, status, token, "", prev_mac)
                plan.requests.extend(_request_rows(events, params))
                lock = None
                if isinstance(change, Change) and change.what == "hold":
                    # Checked and held in the same statement, after the digest's lock.
                    query = self._q["append_event_holding"]
                    params["digest"] = change.digest
                    params["instance"] = change.instance
                    params["overrides"] = list(change.overrides)
                    lock = {"run_id": run_id, "digest": change.digest}
                elif isinstance(change, Change):  # released in the same statement, with it
                    query = self._q["append_event_releasing"]
                    params["release_all"] = change.what == "end"
                    params["release_key"] = change.key
                if not plan.statements and len(events) == 1 and lock is None:
                    # A run's first record (no new hold): in the batch's rows statement.
                    query = None
                    params["state"] = params["status"]  # (arrays are named by adding "s")
                    params.setdefault("release_all", False)
                    params.setdefault("release_key", None)
                plan.statements.append((query, params, len(events), lock))
                next_seq, prev_mac = events[-1].seq + 1, mac
                plan.ends.append((next_seq, mac))
        return plans

    def _batch_trip(self, plans: list[_Plan], synchronous: str) -> list[list[int]] | None:
        """The statements of ``plans`` in one transaction, pipelined: one round trip; the
        rows each wrote, or None when a taken seq or a deadlock undid it all."""
        rows = [plan.statements[0][1] for plan in plans if plan.statements[0][0] is None]
        with self._errors(), self._pool.connection() as conn:
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    # First, the runs' first records, all in one statement (the rows
                    # it wrote come back): the statements that follow chain to them.
                    first = None
                    if rows:
                        params = as_columns(_ROW_COLUMNS, rows)
                        params["synchronous"] = synchronous
                        first = conn.execute(self._q["append_records"], params, prepare=True)
                    cursors: list[list[psycopg.Cursor[Any] | None]] = []
                    for plan in plans:
                        row: list[psycopg.Cursor[Any] | None] = []
                        for query, params, _records, lock in plan.statements:
                            if query is None:
                                row.append(None)  # in the rows statement
                                continue
                            if lock is not None:  # a new hold: its lock, then its append
                                conn.execute(self._q["lock_run_intent"], lock, prepare=True)
                            params["synchronous"] = synchronous
                            row.append(conn.execute(query, params, prepare=True))
                        cursors.append(row)
                    # Last, the decisions' request texts: each kept only where the
                    # statements above wrote its very record (payload and MAC).
                    texts = [text for plan in plans for text in plan.requests]
                    if texts:
                        params = as_columns(_REQUEST_COLUMNS, texts)
                        conn.execute(self._q["insert_requests_after"], params, prepare=True)
                    conn.execute("COMMIT")
            except _UNDONE:
                return None
            finally:  # refused, or a statement failed: never pool an open transaction
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):  # a broken one is discarded
                        conn.rollback()
        landed = {found[0] for found in first.fetchall()} if first is not None else set()
        return [
            [int(plan.run_id in landed) if cur is None else cur.rowcount for cur in row]
            for plan, row in zip(plans, cursors, strict=True)
        ]

    def _append_rest(
        self, group: Sequence[RecordAppend], start: int
    ) -> tuple[int, Exception] | None:
        """A group's records from ``start`` on, each through ``append``; (index, error) of
        the first one refused."""
        for index in range(start, len(group)):
            events, status, token, durable = group[index]
            try:
                self.append(events, status, fencing_token=token, durable=durable)
            except CrashproofError as exc:  # this record's own refusal
                return index, exc
        return None

    def _record_params(self, event: Event, prev_mac: str) -> tuple[dict[str, Any], str | None]:
        """One record as the one-record statements take it (its columns after the run id,
        ``data``: its blob's text or None) and its MAC, chained to ``prev_mac``."""
        blobs, rows, mac = self._rows((event,), prev_mac)
        params: dict[str, Any] = dict(zip(_EVENT_COLUMNS, rows[0][1:], strict=True))
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
            params.update(zip(_EVENT_COLUMNS, rows[0][1:], strict=True))
            params["data"] = blobs[0][1] if blobs else None
        else:
            query = self._q["append_events"]
            params["first"] = events[0].seq
            params["digests"] = [b[0] for b in blobs]
            params["datas"] = [b[1] for b in blobs]
            for i, column in enumerate(_EVENT_COLUMNS, start=1):  # [0] is the run id
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
            requests = [(e.run_id, e.seq, t) for e in events if (t := e.request_text) is not None]
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


def _index_change(events: Sequence[Event]) -> Change | bool | None:
    """What a batch's one-statement append does to the index of unresolved intents for
    ``events``: None (nothing), the change one record makes (an act's intent: a new
    hold; an act's end, a run's end: a release), or False: the checked path (several
    records that touch it)."""
    if not any(touches(e) for e in events):
        return None
    change = change_of(events[0]) if len(events) == 1 else None
    return False if change is None else change


class _Plan:
    """One group of a batch: its index, its run, the one-statement appends of its records'
    prefix (query, parameters, records, and for a new hold the parameters of
    lock_run_intent, sent before it) and the journal's end after each."""

    __slots__ = ("ends", "group", "requests", "run_id", "statements")

    def __init__(self, group: int, run_id: str) -> None:
        self.group = group
        self.run_id = run_id
        # (query None: the run's first record, in the batch's rows statement)
        self.statements: list[tuple[str | None, dict[str, Any], int, dict[str, Any] | None]] = []
        self.ends: list[tuple[int, str | None]] = []
        # The request texts of its records, with what names each record (_REQUEST_COLUMNS).
        self.requests: list[dict[str, Any]] = []


def _request_rows(events: Sequence[Event], params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The rows of insert_requests_after for ``events`` (one run's, appended by the
    one-statement append with ``params``): each request text with its record's run id,
    seq, payload and MAC, as that statement writes them."""
    for i, event in enumerate(events):
        text = event.request_text
        if text is None:
            continue
        if len(events) == 1:  # append_event's plain parameters
            seq, payload, mac = params["seq"], params["payload"], params["mac"]
        else:  # append_events' arrays
            seq, payload, mac = params["seqs"][i], params["payloads"][i], params["macs"][i]
        yield {"run_id": event.run_id, "seq": seq, "payload": payload, "mac": mac, "text": text}


# The threads in which the runs of a batch that the one-statement append could not take
# go on side by side (each its own pool connection: the pool bounds them).
_REST = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="crashproof-pg")


# A batch transaction that meets one of these kept nothing: its groups go one by one.
_UNDONE = (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected)

# The event columns after the run id, in the order of _rows: the parameters of
# append_event, and (plural, as unnest() arrays) of append_events.
_EVENT_COLUMNS = ("seq", "type", "key", "payload", "value", "blob", "created_at", "key_id", "mac")


def as_columns(names: Sequence[str], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``rows`` (one dict of parameters each, one per run) as the parameters of a rows
    statement: an array per column, named by adding "s" (``seq`` -> ``seqs``)."""
    return {f"{name}s": [row[name] for row in rows] for name in names}


# The columns of insert_requests_after.
_REQUEST_COLUMNS = ("run_id", "seq", "payload", "mac", "text")

# The columns of append_records.
_ROW_COLUMNS: tuple[str, ...] = ("run_id", "token", "prev_mac", *_EVENT_COLUMNS, "data")
_ROW_COLUMNS += ("state", "reason", "now", "release_all", "release_key")


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
