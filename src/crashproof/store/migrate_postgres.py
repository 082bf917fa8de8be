"""``crashproof migrate`` for PostgreSQL ledgers: the same plan as SQLite (store/migrate.py),
read through psycopg, and applied the same way: in one transaction, the pending numbered
migrations (each recorded), then the declared value maps (``-- map: TABLE.COLUMN OLD ->
NEW``), then the new schema version. The transaction holds the schema's migration lock
(the one an opening store takes) and re-reads the version it was planned from."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from typing import Any

from crashproof.errors import LedgerError, NotALedger, SchemaTooNew
from crashproof.store.migrate import (
    MigrationPlan,
    MigrationRequired,
    plan_migration,
    split_statements,
)
from crashproof.store.sql import Migration, load_migrations, load_queries

__all__ = ["apply_postgres", "plan_postgres"]

_MIGRATIONS = load_migrations("postgres")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _target(url: str) -> tuple[str, str, str, dict[str, str]]:
    """conninfo, schema, where (for messages) and the named queries of ``url``'s ledger."""
    from crashproof.store.pg_connection import parse_url

    conninfo, schema, display, _pool_size, _witness = parse_url(url)
    schema = schema or "crashproof"
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(f"schema must be a lower-case identifier, not {schema!r}")
    queries = {k: v.replace("{schema}", f'"{schema}"') for k, v in load_queries("postgres").items()}
    return conninfo, schema, f"{display}?schema={schema}", queries


def plan_postgres(url: str, migrations: Sequence[Migration] = _MIGRATIONS) -> MigrationPlan:
    """The plan for the PostgreSQL ledger at ``url`` (``?schema=NAME``); reads only.
    ``migrations``: the numbered migrations to plan (default: this crashproof's)."""
    import psycopg  # here: `import crashproof` must work without psycopg

    conninfo, schema, where, queries = _target(url)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            tables = [r[0] for r in conn.execute(queries["list_tables"], (schema,))]
            if not tables:
                raise LedgerError(f"no ledger in {where}; nothing was changed")
            if "crashproof_meta" not in tables:
                raise NotALedger(f"{where} holds tables that are not a crashproof ledger")
            conn.execute(f'SET search_path TO "{schema}"')
            row = conn.execute(queries["get_meta"], ("schema_version",)).fetchone()
            if row is None or not str(row[0]).isdigit():
                raise NotALedger(f"{where}: the ledger's schema version is missing or invalid")
            current = int(row[0])
            if current > migrations[-1].version:
                too_new = SchemaTooNew(current, migrations[-1].version)
                too_new.args = (f"{where}: {too_new}",)
                raise too_new
            return plan_migration(conn, current, where, migrations, dialect="postgres")
    except psycopg.Error as exc:
        raise LedgerError(
            f"cannot read ledger {where}: {_first(exc)}; nothing was changed"
        ) from None


def _first(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def lock_key(schema: str) -> int:
    """The advisory-lock key of migrating ``schema`` (store/postgres.py takes it on open)."""
    digest = hashlib.sha256(f"crashproof migrate {schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def apply_postgres(url: str, plan: MigrationPlan) -> None:
    """Apply ``plan`` in one transaction (refused when anything is unresolved, or when the
    ledger moved from the schema it was planned at): its migrations, then its value maps."""
    if plan.unresolved:
        raise MigrationRequired(
            f"ledger {plan.where}: {len(plan.unresolved)} unresolved item(s) block the "
            f"migration (first: {plan.unresolved[0]}); nothing was changed"
        )
    import psycopg

    conninfo, schema, where, queries = _target(url)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
            _apply(conn, schema, plan, queries)
    except psycopg.Error as exc:
        raise LedgerError(
            f"cannot migrate ledger {where}: {_first(exc)}; nothing was changed. Check that "
            "the role may alter the schema, then preview again."
        ) from None


def _apply(conn: Any, schema: str, plan: MigrationPlan, queries: dict[str, str]) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
    conn.execute(f'SET LOCAL search_path TO "{schema}"')
    row = conn.execute(queries["get_meta"], ("schema_version",)).fetchone()
    if row is None or str(row[0]) != str(plan.current):
        raise MigrationRequired(
            f"ledger {plan.where} changed since the plan was made (schema "
            f"{row and row[0]}, planned from {plan.current}); nothing was changed. "
            "Preview again."
        )
    for migration in plan.migrations:
        if split_statements(migration.sql):  # (some migrations are only a number)
            conn.execute(migration.sql.encode())
        conn.execute(queries["record_migration"], (migration.version, migration.name, time.time()))
    for m in plan.maps:  # table and column names come from the migration files, not input
        conn.execute(
            f'UPDATE "{m.table}" SET "{m.column}" = %s WHERE "{m.column}" = %s'.encode(),
            (m.new, m.old),
        )
    conn.execute(queries["set_meta"], ("schema_version", str(plan.target)))
