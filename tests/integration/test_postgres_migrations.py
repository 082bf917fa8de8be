"""PostgreSQL: a new ledger (schema.sql) equals one built by every migration in order."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

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


def downgraded(pg_url: str, schema: str) -> str:
    """A ledger of the current code with a run crashed mid-way, taken back to schema 1
    (as a schema-1 crashproof left it): the lease columns, the index of unresolved
    intents, the retry schedule, the requests table and migrations 2 on removed."""
    import crashproof as cp

    url = f"{pg_url}?schema={schema}"
    ledger = cp.Ledger(url, crash_points=cp.CrashPoints(match="after_commit[step_done:double]"))
    try:
        ledger.run(FLOW, run_id="old", n=4)
    except cp.SimulatedCrash:
        pass
    finally:
        ledger.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        for column in ("owner", "lease_expires_at", "fencing_token", "retry_at", "retries"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}".encode())
        conn.execute("DROP TABLE unresolved_intents")
        conn.execute("DROP TABLE requests")
        conn.execute("DELETE FROM crashproof_migrations WHERE version >= 2")
        conn.execute("UPDATE crashproof_meta SET value = '1' WHERE key = 'schema_version'")
    return url


def _flow() -> Any:
    import crashproof as cp

    @cp.workflow("pg-old", version="1")
    def flow(ctx: cp.Context, n: int) -> int:
        doubled = ctx.step("double", lambda x: 2 * x, n)
        return ctx.step("inc", lambda x: x + 1, doubled)

    return flow


FLOW = _flow()


def schema_version(pg_url: str, schema: str) -> str:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT value FROM {schema}.crashproof_meta WHERE key = 'schema_version'".encode()
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_migrate_preview_then_apply_on_postgresql(pg_url: str, capsys: Any) -> None:
    import crashproof as cp
    from crashproof.cli import main

    url = downgraded(pg_url, "old")
    assert main(["migrate", "--db", url, "--preview"]) == 0
    out = capsys.readouterr().out
    assert f"schema 1 -> {SCHEMA_VERSION}" in out
    assert "new column runs.fencing_token BIGINT: 1 existing row(s) get 0" in out
    assert "new column runs.lease_expires_at DOUBLE PRECISION" in out
    assert schema_version(pg_url, "old") == "1"  # the preview wrote nothing
    assert main(["migrate", "--db", url]) == 0
    assert schema_version(pg_url, "old") == str(SCHEMA_VERSION)
    with cp.Ledger(url) as ledger:
        ledger.register(FLOW)
        assert ledger.resume("old") == 9


def test_an_unmappable_value_blocks_postgresql_migration(pg_url: str, capsys: Any) -> None:
    import crashproof as cp
    from crashproof.cli import main
    from crashproof.store.migrate import MigrationRequired

    url = downgraded(pg_url, "odd")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE odd.runs SET status = 'paused'")
    assert main(["migrate", "--db", url, "--preview"]) == 4
    assert "UNRESOLVED: 1 row(s) of runs.status hold 'paused'" in capsys.readouterr().out
    assert main(["migrate", "--db", url]) == 4
    assert schema_version(pg_url, "odd") == "1"
    with pytest.raises(MigrationRequired, match="crashproof migrate"):
        cp.Ledger(url)


def test_a_declared_value_map_is_applied_on_postgresql(pg_url: str) -> None:
    # #28 item 7: the plan listed the map, and applying it refused ("value maps are not
    # applied on PostgreSQL yet"). Now the map rewrites its rows in the same transaction
    # as the migrations, and each migration is recorded.
    from crashproof.store.migrate_postgres import apply_postgres, plan_postgres
    from crashproof.store.sql import Migration

    url = downgraded(pg_url, "mapped")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE mapped.runs SET status = 'paused'")
    migrations = load_migrations("postgres")
    rename = Migration(
        len(migrations) + 1,
        "paused_is_stopped",
        "-- map: runs.status paused -> stopped\nCREATE INDEX runs_by_workflow ON runs (workflow);",
    )
    plan = plan_postgres(url, [*migrations, rename])
    assert plan.unresolved == []
    assert "map runs.status 'paused' -> 'stopped': 1 row(s)" in plan.changes
    apply_postgres(url, plan)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT status FROM mapped.runs").fetchall() == [("stopped",)]
        applied = conn.execute("SELECT version FROM mapped.crashproof_migrations ORDER BY 1")
        assert [r[0] for r in applied] == list(range(1, len(migrations) + 2))
    assert schema_version(pg_url, "mapped") == str(len(migrations) + 1)


def test_a_postgresql_plan_made_stale_is_refused_whole(pg_url: str) -> None:
    from crashproof.store.migrate import MigrationRequired
    from crashproof.store.migrate_postgres import apply_postgres, plan_postgres

    url = downgraded(pg_url, "stale")
    plan = plan_postgres(url)
    apply_postgres(url, plan)  # another operator migrated it meanwhile
    with pytest.raises(MigrationRequired, match="changed since the plan was made"):
        apply_postgres(url, plan)
    assert schema_version(pg_url, "stale") == str(SCHEMA_VERSION)


def test_the_intent_index_is_filled_on_open_from_the_journals(pg_url: str) -> None:
    # A schema-3 ledger (before the index) with one act in flight and one completed:
    # opening it fills the index exactly as the live appends had kept it.
    import crashproof as cp

    class Once(cp.Tool):
        name = "once"

        def execute(self, call: cp.Call) -> cp.Receipt:
            return cp.Receipt("r", None, call.intent_digest)

        def lookup(self, call: cp.Call) -> cp.Receipt | None:
            return None

    @cp.workflow("pg-acts", version="1")
    def acts(ctx: cp.Context, to: str) -> None:
        ctx.act("send", Once(), to=to)

    url = f"{pg_url}?schema=fill"
    crash = cp.CrashPoints(match="before_commit[step_done:send]")
    with cp.Ledger(url, crash_points=crash) as ledger, pytest.raises(cp.SimulatedCrash):
        ledger.run(acts, run_id="in-flight", to="a")
    with cp.Ledger(url) as ledger:
        ledger.run(acts, run_id="done", to="b")
        expected = ledger.store.unresolved_intents()
    assert [(h.run_id, h.key) for h in expected] == [("in-flight", "send")]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET search_path TO fill")
        conn.execute("DROP TABLE unresolved_intents")
        conn.execute("ALTER TABLE runs DROP COLUMN retry_at")  # and schema 5's
        conn.execute("ALTER TABLE runs DROP COLUMN retries")
        conn.execute("DROP TABLE requests")  # and schema 6's
        conn.execute("DELETE FROM crashproof_migrations WHERE version >= 4")
        conn.execute("UPDATE crashproof_meta SET value = '3' WHERE key = 'schema_version'")
    store = PostgresStore(url)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.unresolved_intents() == expected
    finally:
        store.close()
