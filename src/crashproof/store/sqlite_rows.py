"""A journal record as rows of a SQLite ledger: its row id, its insert (a large value
kept once as a blob, or as a text delta of the run's last one), its change to the index
of unresolved intents, and the check of rows loaded back (store/sqlite_journal.py
appends and loads; these are the statements it is made of)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from crashproof.errors import IntegrityError
from crashproof.store.deltas import DeltaMemo
from crashproof.store.intents import Change, IntentHold, held, others
from crashproof.store.port import blob_digest
from crashproof.store.request_texts import kept_form
from crashproof.store.sql import load_queries

__all__ = [
    "REQUEST_PART",
    "RUN_SPAN",
    "apply_change",
    "check_rows",
    "insert_record",
    "insert_request",
    "row_id",
]

_Q = load_queries("sqlite")
RUN_SPAN = 1 << 32  # records per run: the low half of a record's row id is its seq
REQUEST_PART = 1000  # characters of a request per row (insert_request): four to a 4 KB page


def insert_record(
    conn: sqlite3.Connection | sqlite3.Cursor,
    run_id: str,
    run_no: int | None,
    deltas: DeltaMemo,
    record: tuple[int, str, str | None, str, str | None, float, str | None, str | None],
    request: str | None = None,
) -> None:
    """Insert one record (seq, type, key, payload, value, created_at, key_id, mac), its
    value kept once as a content-addressed blob when large (insert_event), as a text
    delta of the run's last large value where it extends it (store/deltas.py), and the
    request text kept beside it (``request``, a ``KeptRequest``'s; insert_request)."""
    seq, type_, key, payload, value, created_at, key_id, mac = record
    if request is not None:
        insert_request(conn, row_id(run_id, run_no, seq), request)
    blob = blob_digest(value)
    if blob is not None and value is not None:
        deltas.insert(conn, run_id, blob, value)
        value = None
    conn.execute(
        _Q["insert_event"],
        (
            row_id(run_id, run_no, seq),
            run_id,
            seq,
            type_,
            key,
            payload,
            value,
            blob,
            created_at,
            key_id,
            mac,
        ),
    )


def insert_request(conn: sqlite3.Connection | sqlite3.Cursor, at: int, request: str) -> None:
    """Insert a request beside the record whose row id is ``at``, in parts of
    ``REQUEST_PART`` characters (schema 9; insert_request cuts them: one statement)."""
    conn.execute(_Q["insert_request"], (at, kept_form(request)))


def apply_change(
    conn: sqlite3.Connection | sqlite3.Cursor, run_id: str, change: Change, *, check: bool
) -> None:
    """Apply one record's change to the index of unresolved intents (store/intents.py);
    ``check``: refuse a new hold another run has (IntentHeld), else install as it is."""
    if change.what == "end":
        conn.execute(_Q["release_run_intents"], (run_id,))
    elif change.what == "release":
        conn.execute(_Q["release_intent"], (run_id, change.key))
    else:
        if check:
            rows = conn.execute(
                _Q["intent_holds"], (run_id, change.key, change.digest, change.instance)
            ).fetchall()
            refusing = others((IntentHold(*row) for row in rows), run_id, change)
            if refusing:
                raise held(run_id, change.key, refusing)
        conn.execute(
            _Q["hold_intent"], (run_id, change.key, change.digest, change.instance, change.since)
        )


def row_id(run_id: str, run_no: int | None, seq: int) -> int:
    """A record's row id (schema.sql: run_no * 2^32 + seq)."""
    if run_no is None or not 0 <= seq < RUN_SPAN:
        raise IntegrityError(
            f"run {run_id!r}: record {seq} cannot be stored (run number {run_no}; a run "
            f"holds records 0 to {RUN_SPAN - 1}); nothing of this write was kept"
        )
    return (run_no << 32) + seq


def check_rows(run_id: str, rows: Sequence[Sequence[Any]]) -> None:
    """Refuse loaded rows (load_events) of which one names another run or lacks its blob.
    (A sealed journal's MACs catch both: this names the cause.)"""
    for row in rows:
        if row[9] is not None:
            raise IntegrityError(
                f"run {run_id!r} record {row[9]} is stored among this run's records but "
                "names another run: the ledger file was edited; nothing was executed. "
                "Restore it from a backup."
            )
        if row[8] is not None and row[4] is None:
            raise IntegrityError(f"run {run_id!r} event {row[0]}: blob {row[8]} is missing")
