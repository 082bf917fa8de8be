"""Many runs' journal appends in one PostgreSQL transaction and one round trip: the
batch half of ``PostgresStore``, on top of the one-run appends of ``pg_append.py``.

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
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import psycopg.errors

from crashproof.errors import CrashproofError
from crashproof.journal.records import Event
from crashproof.store.intents import Change, change_of, touches
from crashproof.store.pg_append import EVENT_COLUMNS, PostgresAppend, as_columns
from crashproof.store.port import RecordAppend
from crashproof.store.request_texts import kept_form

__all__ = ["PostgresBatchAppend"]


class PostgresBatchAppend(PostgresAppend):
    """The batch appends of PostgresStore (see the module docstring)."""

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
        through ``append``; so does a value the database refuses or psycopg cannot
        send (a NUL in a step key, a lone surrogate): one run's records, refused then with
        a clear LedgerError, the other runs' kept. An error of the transaction itself is
        raised for all."""
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
        text = kept_form(text)
        yield {"run_id": event.run_id, "seq": seq, "payload": payload, "mac": mac, "text": text}


# The threads in which the runs of a batch that the one-statement append could not take
# go on side by side (each its own pool connection: the pool bounds them).
_REST = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="crashproof-pg")


# A batch transaction that meets one of these kept nothing: its groups go one by one.
# A value the database refuses (a NUL in a step key: DataError) or psycopg cannot send (a
# lone surrogate) is one run's: it fails that run's own append then, not every run's.
_UNDONE = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DeadlockDetected,
    psycopg.DataError,
    UnicodeEncodeError,
)

# The columns of insert_requests_after.
_REQUEST_COLUMNS = ("run_id", "seq", "payload", "mac", "text")

# The columns of append_records.
_ROW_COLUMNS: tuple[str, ...] = ("run_id", "token", "prev_mac", *EVENT_COLUMNS, "data")
_ROW_COLUMNS += ("state", "reason", "now", "release_all", "release_key")
