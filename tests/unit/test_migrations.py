"""SQLite migrations: the plan, value maps, refusals, atomicity, additive-only on open."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.integrity.keys import resolve_keyring
from crashproof.integrity.seal import Sealer
from crashproof.journal.records import Event, EventType
from crashproof.store.migrate import (
    MigrationRequired,
    apply_plan,
    open_for_migration,
    plan_migration,
)
from crashproof.store.sql import Migration, load_migrations

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
MIGRATIONS = load_migrations("sqlite")


def golden_copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copy(GOLDEN / name, target)
    return target


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def test_a_declared_value_map_resolves_an_unknown_status(tmp_path: Path) -> None:
    path = golden_copy(tmp_path, "schema1_unmappable.db")
    rename = Migration(
        len(MIGRATIONS) + 1,
        "paused_is_stopped",
        "-- map: runs.status paused -> stopped\nCREATE INDEX runs_by_workflow ON runs (workflow);",
    )
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        plan = plan_migration(conn, current, str(path), [*MIGRATIONS, rename])
        assert plan.unresolved == []
        assert "map runs.status 'paused' -> 'stopped': 1 row(s)" in plan.changes
        assert "  new index runs_by_workflow" in plan.changes
        apply_plan(conn, plan, _sealer())
    assert rows(path, "SELECT status FROM runs WHERE run_id = 'g-inflight'") == [("stopped",)]
    versions = rows(path, "SELECT version FROM crashproof_migrations ORDER BY 1")
    assert [v for (v,) in versions] == list(range(1, len(MIGRATIONS) + 2))


def _sealer() -> Sealer:
    return Sealer(resolve_keyring(None))  # the test key (tests/conftest.py)


def test_apply_refuses_an_unresolved_plan_and_writes_nothing(tmp_path: Path) -> None:
    path = golden_copy(tmp_path, "schema1_unmappable.db")
    before = path.read_bytes()
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        plan = plan_migration(conn, current, str(path))
        assert len(plan.unresolved) == 1
        assert not plan.additive
        with pytest.raises(MigrationRequired, match="unresolved"):
            apply_plan(conn, plan, _sealer())
    assert path.read_bytes() == before


def test_a_failing_migration_rolls_back_whole(tmp_path: Path) -> None:
    # Schema 2 with one record already sealed and the others not: sealing must refuse,
    # and the schema-3 columns added earlier in the same transaction must be gone.
    path = golden_copy(tmp_path, "schema1.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(MIGRATIONS[1].sql)
        conn.execute("UPDATE events SET key_id = 'k', mac = 'forged' WHERE seq = 0")
        conn.execute("UPDATE crashproof_meta SET value = '2' WHERE key = 'schema_version'")
        conn.commit()
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        plan = plan_migration(conn, current, str(path))
        assert plan.unsealed == 7
        with pytest.raises(MigrationRequired, match="mixes sealed and unsealed"):
            apply_plan(conn, plan, _sealer())
    assert rows(path, "SELECT value FROM crashproof_meta WHERE key = 'schema_version'") == [("2",)]
    assert "owner" not in {r[1] for r in rows(path, "PRAGMA table_info(runs)")}


def test_additive_and_relayout_migrations_run_on_open(tmp_path: Path) -> None:
    # The golden schema-3 ledger, taken back to schema 2: opening it adds schema 3's
    # columns (additive) and rebuilds the journal with integer row ids (schema 4, a
    # relayout that copies every record as it is), then reads the run.
    path = golden_copy(tmp_path, "schema3.db")
    shutil.copy(GOLDEN / "schema3.db.witness", tmp_path / "schema3.db.witness")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for column in ("owner", "lease_expires_at", "fencing_token"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute("DELETE FROM crashproof_migrations WHERE version = 3")
        conn.execute("UPDATE crashproof_meta SET value = '2' WHERE key = 'schema_version'")
        conn.commit()
    records = rows(path, "SELECT run_id, seq, payload, mac FROM events ORDER BY run_id, seq")
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        assert ledger.get_run("g-done").status is cp.RunStatus.SUCCEEDED
    assert [v for (v,) in rows(path, "SELECT version FROM crashproof_migrations")] == list(
        range(1, len(MIGRATIONS) + 1)
    )
    assert "fencing_token" in {r[1] for r in rows(path, "PRAGMA table_info(runs)")}
    assert rows(path, "SELECT run_id, seq, payload, mac FROM events ORDER BY id") == records
    assert rows(path, "SELECT count(*) FROM events WHERE id - seq != (id >> 32) << 32") == [(0,)]


def test_a_relayout_that_would_lose_records_refuses_and_changes_nothing(tmp_path: Path) -> None:
    path = golden_copy(tmp_path, "schema3.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:  # a record of no run
        conn.execute(
            "INSERT INTO events SELECT 'ghost', seq, type, key, payload, value, blob, "
            "created_at, key_id, mac FROM events WHERE run_id = 'g-done' AND seq = 0"
        )
        conn.commit()
    before = rows(path, "SELECT count(*) FROM events")
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        plan = plan_migration(conn, current, str(path))
        assert plan.additive  # a relayout changes no value
        assert "  rebuild table events in a new layout: 10 row(s) copied as they are" in (
            plan.changes
        )
        with pytest.raises(MigrationRequired, match="copies 9 of the 10 rows of table events"):
            apply_plan(conn, plan, _sealer())
    assert rows(path, "SELECT count(*) FROM events") == before
    assert rows(path, "SELECT value FROM crashproof_meta WHERE key = 'schema_version'") == [("3",)]
    with pytest.raises(MigrationRequired, match="copies 9 of the 10"):
        cp.Ledger(f"sqlite:///{path}")


def test_open_for_migration_refuses_newer_and_foreign_files(tmp_path: Path) -> None:
    path = golden_copy(tmp_path, "schema1.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE crashproof_meta SET value = '99' WHERE key = 'schema_version'")
        conn.commit()
    with pytest.raises(cp.SchemaTooNew, match="99"):
        open_for_migration(path)
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(cp.NotALedger):
        open_for_migration(other)
    with pytest.raises(cp.LedgerError, match="no ledger"):
        open_for_migration(tmp_path / "missing.db")


def test_a_statement_that_rewrites_records_is_not_additive(tmp_path: Path) -> None:
    path = golden_copy(tmp_path, "schema1.db")
    rewrite = Migration(
        len(MIGRATIONS) + 1, "touch", "UPDATE runs SET updated_at = updated_at + 0;"
    )
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        plan = plan_migration(conn, current, str(path), [*MIGRATIONS, rewrite])
    assert plan.rewrites == 1
    assert "  statement: UPDATE runs SET updated_at = updated_at + 0" in plan.changes
    assert not plan.additive


def test_the_intent_index_is_filled_from_the_journals_on_open(tmp_path: Path) -> None:
    # A ledger of schema 5 (before the index): one run crashed with an act in flight, one
    # whose act completed, one that ended with its act unresolved. Opening it migrates
    # (additive: a new table, filled) and indexes exactly the first.
    class Once(cp.Tool):
        name = "once"

        def execute(self, call: cp.Call) -> cp.Receipt:
            return cp.Receipt("r", None, call.intent_digest)

        def lookup(self, call: cp.Call) -> cp.Receipt | None:
            return None

    @cp.workflow("acts", version="1")
    def acts(ctx: cp.Context, to: str) -> None:
        ctx.act("send", Once(), to=to)

    path = tmp_path / "l.db"
    for run_id in ("in-flight", "ended"):
        crash = cp.CrashPoints(match="before_commit[step_done:send]")
        with (
            cp.Ledger(f"sqlite:///{path}", crash_points=crash) as ledger,
            pytest.raises(cp.SimulatedCrash),
        ):
            ledger.run(acts, run_id=run_id, to=run_id)
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        # "ended" ends with its act unresolved (as an abort would end it).
        seq = len(ledger.store.load_events("ended"))
        failed = Event("ended", seq, EventType.RUN_FAILED, None, {"error": {}}, 2e9)
        ledger.store.append([failed], (cp.RunStatus.FAILED, "aborted"))
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.run(acts, run_id="done", to="done")
        expected = ledger.store.unresolved_intents()
    assert [(h.run_id, h.key) for h in expected] == [("in-flight", "send")]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE unresolved_intents")
        conn.execute("ALTER TABLE blobs DROP COLUMN base")  # and schema 7's, to be at 5
        conn.execute("ALTER TABLE blobs DROP COLUMN prefix")
        conn.execute("ALTER TABLE runs DROP COLUMN retry_at")  # and schema 8's
        conn.execute("ALTER TABLE runs DROP COLUMN retries")
        conn.execute("DROP TABLE requests")  # and schema 9's
        conn.execute("DELETE FROM crashproof_migrations WHERE version >= 6")
        conn.execute("UPDATE crashproof_meta SET value = '5' WHERE key = 'schema_version'")
        conn.commit()
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        plan = plan_migration(conn, current, str(path))
    assert plan.additive
    assert "  fill new table unresolved_intents from existing records" in plan.changes
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        assert ledger.store.unresolved_intents() == expected  # as the live index had it
    assert rows(path, "SELECT max(version) FROM crashproof_migrations") == [(9,)]


def test_a_fill_of_a_table_the_migration_does_not_create_is_a_rewrite(tmp_path: Path) -> None:
    path = golden_copy(tmp_path, "schema1.db")
    sneaky = Migration(2, "sneaky", "-- fill: runs\nINSERT INTO runs SELECT * FROM runs WHERE 0;")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        plan = plan_migration(conn, 1, str(path), [MIGRATIONS[0], sneaky])
    assert plan.rewrites == 1
    assert not plan.additive
