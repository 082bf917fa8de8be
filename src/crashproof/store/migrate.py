"""Ledger schema migrations with a preview (SQLite).

A plan lists every change that migrating a ledger makes, before anything is written:

- each pending numbered migration, and what its statements do: new tables, indexes, and
  new columns with the value existing rows get (their DEFAULT, else NULL);
- any other statement (an UPDATE, a DROP...), shown as it is;
- a table rebuilt in a new physical layout, declared in the migration file by a
  ``-- relayout: TABLE`` line: its statements copy every row as it is, which applying
  checks (the row count before and after); it changes no value, so it is not a rewrite;
- a new table filled from existing records, declared by a ``-- fill: TABLE`` line (an
  index such as the unresolved act intents, folded from the journals): it writes only
  into a table the same migration creates and changes no existing value, so it is
  additive;
- value maps declared in a migration file by a ``-- map: TABLE.COLUMN OLD -> NEW`` line
  (e.g. a run status renamed), with the number of rows each one rewrites;
- journal records that carry no MAC (written before schema 2): migrating seals them with
  the current key, in order, so the operator vouches for them as they stand;
- what cannot be mapped: a run status or journal record type this crashproof does not
  know and no migration maps. Any such item is *unresolved* and blocks the migration.

``apply`` writes the whole plan in one transaction and records each migration in
``crashproof_migrations``. Opening a ledger (SQLiteStore) migrates automatically only
when the plan is purely additive (new tables, indexes and columns with defaults); a plan
that rewrites values, seals records, or has anything unresolved refuses to open with
:class:`MigrationRequired` until ``crashproof migrate`` is run.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashproof.errors import LedgerError, NotALedger, SchemaTooNew
from crashproof.journal.records import EventType, RunStatus
from crashproof.store.deltas import Resolver
from crashproof.store.port import GENESIS, RecordSealer
from crashproof.store.sql import Migration, load_migrations, load_queries
from crashproof.store.sqlite_file import check_file

__all__ = [
    "MigrationPlan",
    "MigrationRequired",
    "apply_plan",
    "check_automatic",
    "declared_changes",
    "open_for_migration",
    "plan_migration",
    "run_migration",
    "split_statements",
]

_MIGRATIONS = load_migrations("sqlite")
_Q = load_queries("sqlite")
TARGET = _MIGRATIONS[-1].version

_RELAYOUT = re.compile(r"^--\s*relayout:\s*(\w+)\s*$", re.MULTILINE)
_FILL = re.compile(r"^--\s*fill:\s*(\w+)\s*$", re.MULTILINE)
_INSERT = re.compile(r"INSERT\s+INTO\s+(\w+)", re.IGNORECASE)
_MAP = re.compile(r"^--\s*map:\s*(\w+)\.(\w+)\s+(\S+)\s*->\s*(\S+)\s*$", re.MULTILINE)
_ADD_COLUMN = re.compile(
    r"ALTER\s+TABLE\s+(\w+)\s+ADD\s+COLUMN\s+(\w+)\s+(\w+(?:\s+precision)?)(.*)$",
    re.IGNORECASE | re.DOTALL,
)
_DEFAULT = re.compile(r"DEFAULT\s+('(?:[^']|'')*'|[-\w.]+)", re.IGNORECASE)
_CREATE = re.compile(r"CREATE\s+(TABLE|(?:UNIQUE\s+)?INDEX)\s+(\w+)", re.IGNORECASE)
# What the current code can read, per column; a migration may map other values.
_KNOWN = {
    ("runs", "status"): frozenset(s.value for s in RunStatus),
    ("events", "type"): frozenset(t.value for t in EventType),
}


class MigrationRequired(LedgerError):
    """The ledger's schema is older and its migration is not purely additive (or has
    unresolved items): it must be previewed and applied with ``crashproof migrate``."""


@dataclass(frozen=True, slots=True)
class ValueMap:
    table: str
    column: str
    old: str
    new: str
    rows: int


@dataclass(slots=True)
class MigrationPlan:
    """Every change migrating one ledger would make; nothing is written to build it."""

    where: str
    current: int
    target: int
    migrations: list[Migration] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    maps: list[ValueMap] = field(default_factory=list)
    unsealed: int = 0  # journal records without a MAC, sealed by the migration
    rewrites: int = 0  # statements other than new tables, indexes and columns
    unresolved: list[str] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        return bool(self.migrations or self.maps or self.unsealed)

    @property
    def additive(self) -> bool:
        """Only new tables/indexes/columns: safe to apply on open without a review."""
        return not (self.maps or self.unsealed or self.unresolved or self.rewrites)

    def lines(self) -> list[str]:
        """The plan as human lines (``crashproof migrate --preview``)."""
        if not self.pending and not self.unresolved:
            return [f"{self.where}: schema {self.current} is current; nothing to migrate"]
        out = [f"{self.where}: schema {self.current} -> {self.target}"]
        out += [f"  change: {c}" for c in self.changes]
        out += [f"  UNRESOLVED: {u}" for u in self.unresolved]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger": self.where,
            "current": self.current,
            "target": self.target,
            "migrations": [f"{m.version:04d}_{m.name}" for m in self.migrations],
            "changes": list(self.changes),
            "unresolved": list(self.unresolved),
            "additive": self.additive,
        }


def split_statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _columns(conn: Any, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _describe(statement: str, conn: Any) -> str:
    flat = " ".join(statement.split())
    added = _ADD_COLUMN.match(flat)
    if added:
        table, column, type_, rest = added.groups()
        rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        default = _DEFAULT.search(rest)
        value = default.group(1) if default else "NULL"
        return f"new column {table}.{column} {type_.upper()}: {rows} existing row(s) get {value}"
    created = _CREATE.match(flat)
    if created:
        return f"new {created.group(1).lower()} {created.group(2)}"
    return f"statement: {flat[:120]}"


def plan_migration(
    conn: Any,
    current: int,
    where: str,
    migrations: Sequence[Migration] = _MIGRATIONS,
    *,
    dialect: str = "sqlite",
) -> MigrationPlan:
    """The plan for a ledger at schema ``current`` (read-only queries only). ``conn``: a
    sqlite3 connection, or a psycopg one with ``search_path`` on the ledger's schema
    (``dialect="postgres"``). ``migrations``: the dialect's numbered migrations."""
    plan = MigrationPlan(where=where, current=current, target=migrations[-1].version)
    plan.migrations = [m for m in migrations if m.version > current]
    mapped: dict[tuple[str, str], dict[str, str]] = {}
    for migration in plan.migrations:
        plan.changes.append(f"migration {migration.version:04d}_{migration.name}")
        relayout = _RELAYOUT.findall(migration.sql)
        for table in relayout:
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            plan.changes.append(
                f"  rebuild table {table} in a new layout: {rows} row(s) copied as they are"
            )
        statements = split_statements(migration.sql)
        created = {m.group(2) for m in map(_CREATE.match, statements) if m}
        fills = set(_FILL.findall(migration.sql)) & created  # only a table made here
        for statement in statements:
            filled = _INSERT.match(statement)
            if filled and filled.group(1) in fills:
                plan.changes.append(f"  fill new table {filled.group(1)} from existing records")
                continue
            change = _describe(statement, conn)
            plan.rewrites += change.startswith("statement:") and not relayout
            plan.changes.append("  " + change)
        for table, column, old, new in _MAP.findall(migration.sql):
            mapped.setdefault((table, column), {})[old] = new
    for (table, column), known in _KNOWN.items():
        values = conn.execute(
            f"SELECT {column}, count(*) FROM {table} GROUP BY {column} ORDER BY {column}"
        ).fetchall()
        renames = mapped.get((table, column), {})
        for value, rows in values:
            new = renames.get(value)
            if new is not None and new in known:
                plan.maps.append(ValueMap(table, column, value, new, rows))
                plan.changes.append(f"map {table}.{column} {value!r} -> {new!r}: {rows} row(s)")
            elif value not in known:
                plan.unresolved.append(
                    f"{rows} row(s) of {table}.{column} hold {value!r}, which this crashproof "
                    f"does not know and no migration maps (known: {', '.join(sorted(known))})"
                )
    if dialect != "sqlite":
        return plan  # PostgreSQL ledgers were sealed from their first schema
    if "mac" not in _columns(conn, "events"):
        plan.unsealed = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    else:
        plan.unsealed = conn.execute("SELECT count(*) FROM events WHERE mac IS NULL").fetchone()[0]
    if plan.unsealed:
        runs = conn.execute("SELECT count(DISTINCT run_id) FROM events").fetchone()[0]
        plan.changes.append(
            f"seal {plan.unsealed} journal record(s) of {runs} run(s) that carry no MAC "
            "(written before schema 2) with the current key: migrating vouches for them "
            "as they stand"
        )
    return plan


def declared_changes(
    dialect: str, since: int, until: int
) -> tuple[list[dict[str, str]], list[str]]:
    """What the numbered migrations after ``since`` up to ``until`` of ``dialect`` declare:
    their value maps (table, column, old, new) and their new columns, each with the value
    existing rows got (a compatibility verdict lists them: runtime/replayer/verdict.py)."""
    maps: list[dict[str, str]] = []
    defaults: list[str] = []
    for migration in load_migrations(dialect):
        if not since < migration.version <= until:
            continue
        for table, column, old, new in _MAP.findall(migration.sql):
            maps.append({"table": table, "column": column, "old": old, "new": new})
        for statement in split_statements(migration.sql):
            added = _ADD_COLUMN.match(" ".join(statement.split()))
            if added:
                default = _DEFAULT.search(added.group(4))
                value = default.group(1) if default else "NULL"
                defaults.append(f"{added.group(1)}.{added.group(2)} = {value}")
    return maps, defaults


def check_automatic(
    conn: Any, current: int, where: str, migrations: Sequence[Migration] = _MIGRATIONS
) -> None:
    """Raise MigrationRequired unless migrating on open is purely additive (``conn`` as
    for plan_migration; ``migrations``: the dialect's)."""
    if current >= migrations[-1].version:
        return
    dialect = "sqlite" if isinstance(conn, sqlite3.Connection) else "postgres"
    plan = plan_migration(conn, current, where, migrations, dialect=dialect)
    if plan.additive:
        return
    what = "has unresolved items" if plan.unresolved else "rewrites or seals existing records"
    raise MigrationRequired(
        f"ledger {where} is at schema {current}, this crashproof uses {plan.target}, and the "
        f"migration {what}; nothing was changed. Review it with `crashproof migrate --db URL "
        "--preview`, then apply it with `crashproof migrate --db URL`."
    )


def apply_plan(
    conn: sqlite3.Connection, plan: MigrationPlan, sealer: RecordSealer | None
) -> list[tuple[str, int]]:
    """Apply ``plan`` in one transaction on ``conn`` (autocommit mode); returns the runs
    whose records were sealed, with their generation. Refuses an unresolved plan."""
    if plan.unresolved:
        raise MigrationRequired(
            f"ledger {plan.where}: {len(plan.unresolved)} unresolved item(s) block the "
            f"migration (first: {plan.unresolved[0]}); nothing was changed. Map them in a "
            "migration or repair the records, then preview again."
        )
    if plan.unsealed and sealer is None:
        raise MigrationRequired(
            f"ledger {plan.where}: {plan.unsealed} record(s) must be sealed and no key was "
            "given; nothing was changed. Set CRASHPROOF_KEY (or CRASHPROOF_KEY_FILE)."
        )
    try:
        return _apply(conn, plan, sealer)
    except sqlite3.Error as exc:
        raise LedgerError(
            f"cannot migrate ledger {plan.where} ({exc}); nothing was changed. Check that no "
            "other process holds it locked, the disk, and the file's permissions."
        ) from None


def _apply(
    conn: sqlite3.Connection, plan: MigrationPlan, sealer: RecordSealer | None
) -> list[tuple[str, int]]:
    sealed: list[tuple[str, int]] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute(_Q["get_meta"], ("schema_version",)).fetchone()
        if row is None or int(row[0]) != plan.current:
            raise MigrationRequired(
                f"ledger {plan.where} changed since the plan was made (schema "
                f"{row and row[0]}, planned from {plan.current}); nothing was changed. "
                "Preview again."
            )
        for migration in plan.migrations:
            run_migration(conn, migration, plan.where)
            conn.execute(_Q["record_migration"], (migration.version, migration.name, time.time()))
        for m in plan.maps:
            conn.execute(
                f"UPDATE {m.table} SET {m.column} = ? WHERE {m.column} = ?", (m.new, m.old)
            )
        if plan.unsealed and sealer is not None:
            sealed = _seal_unsealed(conn, sealer)
        conn.execute(_Q["set_meta"], ("schema_version", str(plan.target)))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return sealed


def run_migration(conn: sqlite3.Connection, migration: Migration, where: str) -> None:
    """Execute one migration's statements inside the caller's transaction. A table it
    declares rebuilt (``-- relayout: TABLE``) must hold as many rows after as before."""
    tables = _RELAYOUT.findall(migration.sql)
    before = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables]
    for statement in split_statements(migration.sql):
        conn.execute(statement)
    for table, count in zip(tables, before, strict=True):
        after = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        if after != count:
            raise MigrationRequired(
                f"ledger {where}: migration {migration.version:04d}_{migration.name} copies "
                f"{after} of the {count} rows of table {table} (rows that belong to no "
                "run?); nothing was changed. Check the ledger with `crashproof check`."
            )


def _seal_unsealed(conn: sqlite3.Connection, sealer: RecordSealer) -> list[tuple[str, int]]:
    """Seal every run that has a record without a MAC, whole, from its first record."""
    run_ids = [r[0] for r in conn.execute("SELECT DISTINCT run_id FROM events WHERE mac IS NULL")]
    Resolver(conn, check_digest=True)  # (load_events reads deltas through it; none here)
    sealed = []
    for run_id in sorted(run_ids):
        rows: Sequence[Any] = conn.execute(_Q["load_events"], (run_id,)).fetchall()
        prev = GENESIS
        for seq, type_, key, payload, value, created_at, key_id, mac, *_ in rows:
            if mac is not None:
                raise MigrationRequired(
                    f"run {run_id!r} mixes sealed and unsealed records (record {seq} is "
                    "sealed); nothing was changed. Restore the ledger from a backup."
                )
            key_id, mac = sealer.seal(run_id, seq, type_, key, payload, value, created_at, prev)
            conn.execute(
                "UPDATE events SET key_id = ?, mac = ? WHERE run_id = ? AND seq = ?",
                (key_id, mac, run_id, seq),
            )
            prev = mac
        sealed.append((run_id, len(rows)))
    return sealed


def open_for_migration(path: Path) -> tuple[sqlite3.Connection, int]:
    """A connection to the SQLite ledger at ``path`` (autocommit; nothing written yet)
    and its schema version. Refuses a missing file, a non-ledger, and a newer schema."""
    if not path.is_file():
        raise LedgerError(f"no ledger at {path}; nothing was changed")
    check_file(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        row = (
            conn.execute(_Q["get_meta"], ("schema_version",)).fetchone()
            if "crashproof_meta" in tables
            else None
        )
        if row is None or not str(row[0]).isdigit():
            raise NotALedger(f"{path} is not a crashproof ledger; nothing was changed")
        current = int(row[0])
        if current > TARGET:
            too_new = SchemaTooNew(current, TARGET)
            too_new.args = (f"{path}: {too_new}",)
            raise too_new
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise NotALedger(
            f"{path} cannot be read as a ledger ({exc}); nothing was changed"
        ) from None
    except BaseException:
        conn.close()
        raise
    return conn, current
