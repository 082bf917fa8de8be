"""Sql: statements that run once, with their receipt in the same transaction.

``ctx.act("add-index", Sql(connection), sql="CREATE INDEX ...; UPDATE ...")`` runs the
statements in one transaction on the user's own connection (``sqlite3`` or psycopg 3),
and in that same transaction writes one row into a receipt table
(``crashproof_receipts``, created on demand)::

    operation_id   the act's operation id (run id / step key): the key
    intent_digest  the act's intent digest (for a migration: the file's SHA-256)
    run_id, step   which run and act wrote it
    kind           "sql" or "migration"
    result         the act's result, JSON: {"statements": n, "rows_affected": n, ...}
    committed_at   epoch seconds from the database's clock at the insert, just before
                   the commit (SQLite julianday('now'), PostgreSQL clock_timestamp())
    fencing_token  the run owner's fencing token (NULL without one)

The change and its receipt are one durability domain (seeds 000, 003): either both
committed or neither. So ``lookup`` is a select by operation id, and its answer is exact:

- found with the same intent: done; the stored result is the act's result;
- found with another intent: a receipt conflict, the run freezes for review (for a
  migration, a file changed since it was applied: ``cp.DriftError``, frozen too);
- not found: the transaction never committed, so executing again is safe.

A crash before the commit, during it, or after it but before the journal records the
receipt therefore ends with the change applied exactly once. ``execute`` checks the
receipt inside its own transaction too (under the write lock on SQLite, against the
primary key on PostgreSQL), so a second worker or a second run reusing the key never
applies it twice.

Params: ``sql`` (one or more statements; a ``;`` inside quotes, comments or a trigger's
body does not split them), and optionally ``args`` (a list: then ``sql`` is one
statement with the driver's placeholders, ``?`` for sqlite3, ``%s`` for psycopg). A
statement that begins or ends a transaction (``BEGIN``, ``COMMIT``, ``ROLLBACK``...) is
refused before anything runs: it would split the change from its receipt. Statements are
writes; a read belongs in ``ctx.step``.

Fencing: an act carrying a fencing token first reads the highest token on its run's
receipts, under a lock (SQLite's write lock; a PostgreSQL transaction-scoped advisory
lock on the run id); a higher one means a newer owner has written, so this worker stops
with ``cp.StaleLeaseError`` and applies nothing.

Errors, as the act protocol reads them:

- a statement fails: the transaction is rolled back and the act fails permanently
  (``cp.ActFailed``, recorded: one line naming the statement's line in the script and
  the database's message);
  nothing was applied and no receipt exists, so a fixed statement runs cleanly on
  ``crashproof retry``;
- a lock or serialization failure (SQLite busy, PostgreSQL 40xxx or 55P03): rolled back,
  retried with backoff (``cp.RetryableError``);
- the connection is closed or lost before the commit: ``cp.Unavailable``, the run stops
  resumable;
- anything at the commit itself (the connection dropped while committing): an unknown
  outcome, which the runtime settles by ``lookup``.

A lookup on a SQLite file reads through a connection of its own (it may run in another
thread than the one that opened the caller's, and it must see only what committed); on
PostgreSQL it reads through the caller's connection, in a short transaction.

The connection must be idle when the act starts (no transaction of the caller's open):
the act's commit would otherwise commit the caller's work too. A sqlite3 connection
opened with Python 3.12's ``autocommit=False`` always has one open, so it is refused.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from crashproof.errors import (
    DriftError,
    PermanentError,
    RetryableError,
    StaleLeaseError,
    Unavailable,
)
from crashproof.tools._sql_dialects import ConnectionBusy, Dialect, Row, dialect_for
from crashproof.tools._sql_statements import split_postgres, split_sqlite, transaction_control
from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["RECEIPTS_TABLE", "ConnectionBusy", "Sql"]

RECEIPTS_TABLE = "crashproof_receipts"
_PARAMS = frozenset({"sql", "args"})
_MESSAGE = 240  # characters of the database's message kept in the one-line failure


@dataclass(frozen=True, slots=True)
class Change:
    """What one act commits: the statements, and the receipt row's key and intent."""

    key: str  # the receipt's operation_id
    intent: str  # what a found receipt must carry to be this act's
    kind: str
    sql: str
    args: list[Any] | None
    describe: dict[str, Any]  # extra result fields (a migration's name and digest)


class Sql(Tool):
    """Statements run once per act, their receipt committed with them (module docstring).

    ``connection``: a ``sqlite3.Connection`` or a psycopg 3 ``Connection``, owned by the
    caller (never closed here). ``table``: the receipt table's name."""

    name: ClassVar[str] = "sql"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = True
    # The receipt is checked inside execute's own transaction: a repeat is a no-op.
    idempotent_execute: ClassVar[bool] = True
    # A worker whose token is lower than one on the run's receipts applies nothing.
    honours_fencing: ClassVar[bool] = True

    def __init__(self, connection: Any, *, table: str = RECEIPTS_TABLE) -> None:
        self._db: Dialect = dialect_for(connection, table)

    def prepare(self, call: Call) -> dict[str, Any] | None:
        """Refuse malformed params before the intent is recorded (the act fails)."""
        self._change(call)
        return None

    def execute(self, call: Call) -> Receipt:
        return apply_once(self._db, call, self._change(call))

    def lookup(self, call: Call) -> Receipt | None:
        return look_up(self._db, call, self._change(call))

    def _change(self, call: Call) -> Change:
        params = call.params
        unknown = set(params) - _PARAMS
        if unknown:
            raise PermanentError(
                f"unknown params {sorted(unknown)} for the sql tool (it takes sql and args)"
            )
        sql, args = params.get("sql"), params.get("args")
        if not isinstance(sql, str) or not sql.strip():
            raise PermanentError("the sql tool needs sql: a non-empty string of statements")
        if args is not None and not isinstance(args, list):
            raise PermanentError(f"sql args must be a list, not {type(args).__name__}")
        checked(self._db, sql)
        return Change(call.operation_id, call.intent_digest, "sql", sql, args, {})


def checked(db: Dialect, sql: str) -> None:
    """Refuse a script that would begin or end a transaction (PermanentError)."""
    statements = split_sqlite(sql) if db.name == "sqlite" else split_postgres(sql)
    control = transaction_control(statements)
    if control is not None:
        raise PermanentError(
            f"refused {control!r}: the statements run inside the act's own transaction, "
            "with its receipt; remove BEGIN/COMMIT/ROLLBACK from the script"
        )


def apply_once(db: Dialect, call: Call, change: Change) -> Receipt:
    """Run ``change`` and write its receipt in one transaction; the receipt already
    there (an earlier attempt or caller committed it) is returned instead."""
    with db.lock:
        return _apply(db, call, change)


def _apply(db: Dialect, call: Call, change: Change) -> Receipt:
    try:
        why = db.busy()
    except Exception as exc:  # e.g. a sqlite3 connection used from another thread
        raise _failure(db, exc, "cannot use the connection") from exc
    if why is not None:  # nothing was sent: certain it did not happen
        raise PermanentError(f"act {call.step!r}: {why}")
    try:
        found, row = _stage(db, call, change)
        if found is None:
            call.crash_point("statements")  # all run, receipt written, not committed
    except _Taken as taken:
        _rolled_back(db)
        # Another worker committed the same key meanwhile (PostgreSQL waits for it, then
        # the primary key refuses this row): its receipt is the answer.
        other = _read_quietly(db, change.key)
        if other is not None:
            return _receipt(other, call, change)
        raise _failure(db, taken.error, "could not write its receipt") from taken.error
    except BaseException:
        _rolled_back(db)  # a simulated crash too: no transaction stays open
        raise
    if found is not None:  # done before, by an earlier attempt or another caller
        _rolled_back(db)
        return _receipt(found, call, change)
    try:
        db.commit()
    except Exception:
        # The commit may or may not have reached the database: an unknown outcome,
        # which the runtime settles by lookup.
        _rolled_back(db)
        raise
    call.crash_point("committed")  # in the database, not yet in the journal
    return _receipt(row, call, change)


class _Taken(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _stage(db: Dialect, call: Call, change: Change) -> tuple[Row | None, Row]:
    """Begin, and either find the receipt (returned first) or run the statements and
    write the receipt row (returned second, its ``committed_at`` the database's)."""
    try:
        db.begin()
    except Exception as exc:
        raise _failure(db, exc, "could not begin the transaction") from exc
    call.crash_point("begun")
    try:
        db.ensure_table()
        highest = db.fence(call.run_id) if call.fencing_token is not None else None
    except Exception as exc:
        raise _failure(db, exc, "could not read the run's fencing token") from exc
    if highest is not None and call.fencing_token is not None and highest > call.fencing_token:
        raise StaleLeaseError(
            f"act {call.step!r}: the run's receipts carry fencing token {highest}, this "
            f"worker's is {call.fencing_token}: a newer owner has written; nothing applied"
        )
    try:
        found = db.receipt(change.key)
        if found is not None:
            return found, found
        statements, rows = db.run(change.sql, change.args)
    except Exception as exc:
        raise _failure(db, exc, "statement failed") from exc
    result = {"statements": statements, "rows_affected": rows, **change.describe}
    row = Row(
        change.key,
        change.intent,
        call.run_id,
        call.step,
        change.kind,
        json.dumps(result, sort_keys=True, separators=(",", ":")),
        0.0,
        call.fencing_token,
    )
    try:
        return None, row._replace(committed_at=db.insert(row))
    except Exception as exc:
        raise _Taken(exc) from exc


def look_up(db: Dialect, call: Call, change: Change) -> Receipt | None:
    """The receipt of ``change`` if its transaction committed, else None (exact: the
    change and its receipt commit together)."""
    try:
        found = db.read(change.key)
    except ConnectionBusy as exc:
        raise ConnectionBusy(f"cannot look up act {call.step!r}: {exc}") from exc
    return None if found is None else _receipt(found, call, change)


def _receipt(row: Row, call: Call, change: Change) -> Receipt:
    if row.intent_digest != change.intent and change.kind == "migration":
        raise DriftError(
            f"migration {change.describe.get('migration')!r} was applied (by run "
            f"{row.run_id!r} at {row.committed_at:.3f}) from a file with SHA-256 "
            f"{row.intent_digest}, the file now has {change.intent}: an applied migration "
            "never runs again; restore the file, and put the change in a new migration"
        )
    # Same intent: vouched as this act's. Another one: the stored digest, which the
    # runtime sees differ from the journal's (a receipt conflict, frozen for review).
    same = row.intent_digest == change.intent
    return Receipt(
        receipt_id=row.operation_id,
        result=json.loads(row.result),
        intent_digest=call.intent_digest if same else row.intent_digest,
        committed_at=row.committed_at,
    )


def _failure(db: Dialect, exc: Exception, what: str) -> Exception:
    """The act protocol's reading of a driver error raised before the commit."""
    kind = db.classify(exc)
    text = _one_line(exc)
    if "same thread" in text:  # sqlite3's check_same_thread: nothing was run
        return PermanentError(
            f"the {db.name} connection belongs to another thread ({text}); crashproof may "
            "run an act in a worker thread: open it with check_same_thread=False"
        )
    if kind == "connection":
        return Unavailable(f"the {db.name} connection is gone ({text}); nothing was applied")
    if kind == "retry":
        return RetryableError(f"{db.name} {what}, rolled back ({text}); a retry may pass")
    notes = getattr(exc, "__notes__", None)
    where = f" at {notes[-1]}" if notes else ""
    return PermanentError(
        f"{db.name} {what}{where}: {text}; rolled back, nothing applied: fix the statement, "
        "then retry the run"
    )


def _one_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    text = "".join(c if c.isprintable() else "?" for c in first)[:_MESSAGE]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _rolled_back(db: Dialect) -> None:
    # A broken connection cannot roll back: the server does, on its own.
    with contextlib.suppress(Exception):
        db.rollback()


def _read_quietly(db: Dialect, key: str) -> Row | None:
    try:
        return db.receipt(key)
    except Exception:
        _rolled_back(db)
        return None
