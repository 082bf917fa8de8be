"""``crashproof migrate`` for PostgreSQL ledgers: the same plan as SQLite (store/migrate.py),
read through psycopg; applying it is opening the store, which runs the pending numbered
migrations in one transaction under an advisory lock and records each one."""

from __future__ import annotations

import re

from crashproof.errors import LedgerError, NotALedger, SchemaTooNew
from crashproof.store.migrate import MigrationPlan, MigrationRequired, plan_migration
from crashproof.store.sql import load_migrations, load_queries

__all__ = ["apply_postgres", "plan_postgres"]

_MIGRATIONS = load_migrations("postgres")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def plan_postgres(url: str) -> MigrationPlan:
    """The plan for the PostgreSQL ledger at ``url`` (``?schema=NAME``); reads only."""
    import psycopg  # here: `import crashproof` must work without psycopg

    from crashproof.store.pg_connection import parse_url

    conninfo, schema, display, _pool_size = parse_url(url)
    schema = schema or "crashproof"
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(f"schema must be a lower-case identifier, not {schema!r}")
    where = f"{display}?schema={schema}"
    queries = {k: v.replace("{schema}", f'"{schema}"') for k, v in load_queries("postgres").items()}
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
            if current > _MIGRATIONS[-1].version:
                too_new = SchemaTooNew(current, _MIGRATIONS[-1].version)
                too_new.args = (f"{where}: {too_new}",)
                raise too_new
            return plan_migration(conn, current, where, _MIGRATIONS, dialect="postgres")
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LedgerError(f"cannot read ledger {where}: {first}; nothing was changed") from None


def apply_postgres(url: str, plan: MigrationPlan) -> None:
    """Apply ``plan`` (refused when anything is unresolved or it maps values)."""
    if plan.unresolved:
        raise MigrationRequired(
            f"ledger {plan.where}: {len(plan.unresolved)} unresolved item(s) block the "
            f"migration (first: {plan.unresolved[0]}); nothing was changed"
        )
    if plan.maps:
        raise MigrationRequired(
            f"ledger {plan.where}: value maps are not applied on PostgreSQL yet; nothing "
            "was changed"
        )
    from crashproof.store.postgres import PostgresStore

    PostgresStore(url).close()  # migrates in one transaction, recording each migration
