"""PostgreSQL: a new ledger (schema.sql) equals one built by every migration in order."""

from __future__ import annotations

from typing import Any

import psycopg

from crashproof.store.postgres import SCHEMA_VERSION, PostgresStore
from crashproof.store.sql import load_migrations


def structure(url: str, schema: str) -> dict[str, Any]:
    """Columns, constraints and indexes of one schema, from information_schema and
    pg_indexes, with the schema's own name taken out."""
    with psycopg.connect(url, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT table_name, ordinal_position, column_name, data_type, is_nullable, "
            "column_default FROM information_schema.columns WHERE table_schema = %s "
            "ORDER BY 1, 2",
            (schema,),
        ).fetchall()
        constraints = conn.execute(
            "SELECT tc.table_name, tc.constraint_type, kcu.column_name, kcu.ordinal_position "
            "FROM information_schema.table_constraints AS tc "
            "JOIN information_schema.key_column_usage AS kcu "
            "ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema "
            "WHERE tc.table_schema = %s ORDER BY 1, 2, 3, 4",
            (schema,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, replace(indexdef, %s, 'S') FROM pg_indexes "
            "WHERE schemaname = %s ORDER BY 1, 2",
            (f"{schema}.", schema),
        ).fetchall()
    return {"columns": columns, "constraints": constraints, "indexes": indexes}


def test_the_schema_equals_all_migrations_applied(pg_url: str) -> None:
    store = PostgresStore(f"{pg_url}?schema=fresh")  # a new ledger: schema.sql
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA migrated")
        conn.execute("SET search_path TO migrated")
        for migration in load_migrations("postgres"):
            conn.execute(migration.sql.encode())
    fresh, migrated = structure(pg_url, "fresh"), structure(pg_url, "migrated")
    assert fresh["columns"]  # the comparison is not vacuous
    assert fresh == migrated


def test_an_old_ledger_migrates_on_open_and_records_each_migration(pg_url: str) -> None:
    first = load_migrations("postgres")[0]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA old")
        conn.execute("SET search_path TO old")
        conn.execute(first.sql.encode())
        conn.execute("INSERT INTO crashproof_meta VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO crashproof_migrations VALUES (1, 'initial', 0)")
    store = PostgresStore(f"{pg_url}?schema=old")
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        applied = conn.execute("SELECT version FROM old.crashproof_migrations ORDER BY 1")
        assert [r[0] for r in applied] == list(range(1, SCHEMA_VERSION + 1))
    PostgresStore(f"{pg_url}?schema=fresh").close()
    assert structure(pg_url, "old") == structure(pg_url, "fresh")


def test_replay_reads_a_postgresql_ledger(pg_url: str) -> None:
    import crashproof as cp

    @cp.workflow("pg-flow", version="1")
    def flow(ctx: cp.Context, n: int) -> int:
        return ctx.step("double", lambda x: 2 * x, n)

    @cp.workflow("pg-flow", version="1")
    def changed(ctx: cp.Context, n: int) -> int:
        return ctx.step("double", lambda x: 2 * x, n + 1)

    with cp.Ledger(pg_url) as ledger:
        ledger.run(flow, run_id="p", n=2)
    assert [v.status for v in cp.replay_check([flow], pg_url)] == ["compatible"]
    assert [v.step for v in cp.replay_check([changed], pg_url)] == [1]
