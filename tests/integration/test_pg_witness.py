"""The generation witness of a PostgreSQL ledger lives in a schema of its own, so that
restoring the ledger's schema (an older dump, a careless edit) is caught as a rollback."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

import crashproof as cp
from crashproof.integrity.pg_witness import PostgresWitness
from integration._targets import Target
from integration.test_integrity import KEY, make


def open_ledger(url: str, **kw: Any) -> cp.Ledger:
    return cp.Ledger(url, key=KEY, **kw)


def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    conninfo = url.split("?", 1)[0]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cursor = conn.execute(statement.encode())
        return cursor.fetchall() if cursor.description is not None else []


def crash_before_act(url: str, target: Target) -> None:
    points = cp.CrashPoints(match="before_commit[act_intent:create]")
    with open_ledger(url, crash_points=points) as ledger, pytest.raises(cp.SimulatedCrash):
        ledger.run(make(target), run_id="r")


def test_witness_follows_the_journal_in_its_own_schema(pg_url: str, tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    with open_ledger(pg_url) as ledger:
        assert ledger.run(make(target), run_id="r")[-1] == {"id": "rec-1"}
    journal = sql(pg_url, "SELECT count(*) FROM crashproof.events WHERE run_id = 'r'")[0][0]
    witnessed = sql(pg_url, "SELECT generation FROM crashproof_witness.witness")
    assert witnessed == [(journal,)]  # the run's outcome is an output point


def test_restored_ledger_schema_is_refused(pg_url: str, tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    crash_before_act(pg_url, target)
    # The backup: the ledger's tables as they were before the act (the witness is apart).
    sql(pg_url, "CREATE TABLE public.events_backup AS SELECT * FROM crashproof.events")
    with open_ledger(pg_url) as ledger:
        ledger.run(make(target), run_id="r")
    assert target.count("executes", "r/create") == 1
    sql(pg_url, "DELETE FROM crashproof.events WHERE run_id = 'r'")
    sql(pg_url, "INSERT INTO crashproof.events SELECT * FROM public.events_backup")
    with open_ledger(pg_url) as ledger:
        with pytest.raises(cp.JournalRolledBack, match="journal holds 5"):
            ledger.run(make(target), run_id="r")
        with pytest.raises(cp.JournalRolledBack):
            ledger.get_run("r")
    assert target.count("executes", "r/create") == 1  # not executed a second time


def test_a_run_the_schema_lost_is_reported_lost(pg_url: str, tmp_path: Path) -> None:
    """The whole run gone from the ledger's schema (a dump restored from before it began):
    check, show and resume report it lost for every run the witness saw (#26 item 3)."""
    target = Target(tmp_path / "t.json")
    with open_ledger(pg_url) as ledger:
        ledger.run(make(target), run_id="r")
        ledger.run(make(target), run_id="kept")
    sql(pg_url, "DELETE FROM crashproof.events WHERE run_id = 'r'")
    sql(pg_url, "DELETE FROM crashproof.runs WHERE run_id = 'r'")
    with open_ledger(pg_url) as ledger:
        assert ledger.witness is not None
        assert set(ledger.witness.known()) == {"r", "kept"}
        report = dict(ledger.check())
        assert report["kept"] is None
        assert report["r"] is not None
        assert report["r"].startswith("JournalRolledBack: run 'r' is lost from the journal")
        for call in (ledger.get_run, ledger.resume):
            with pytest.raises(cp.JournalRolledBack, match="lost from the journal"):
                call("r")
        with pytest.raises(cp.JournalRolledBack):
            ledger.run(make(target), run_id="r")
    assert sql(pg_url, "SELECT count(*) FROM crashproof.events WHERE run_id = 'r'") == [(0,)]
    assert target.count("executes", "r/create") == 1


def test_missing_witness_is_refused_until_reanchored(pg_url: str, tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    crash_before_act(pg_url, target)
    sql(pg_url, "DELETE FROM crashproof_witness.witness")
    with open_ledger(pg_url) as ledger:
        with pytest.raises(cp.WitnessMissing):
            ledger.run(make(target), run_id="r")
        assert target.count("executes", "r/create") == 0
        assert ledger.reanchor("r", by="ops@example") == 5
        assert ledger.run(make(target), run_id="r")[-1] == {"id": "rec-1"}


def test_witness_schema_follows_the_ledger_schema(pg_url: str, tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    url = f"{pg_url}?schema=team_a"
    with open_ledger(url) as ledger:
        ledger.run(make(target), run_id="r")
    assert sql(pg_url, "SELECT run_id FROM team_a_witness.witness") == [("r",)]
    schemas = {row[0] for row in sql(pg_url, "SELECT nspname FROM pg_namespace")}
    assert "crashproof_witness" not in schemas


def test_witness_url_puts_the_witness_in_another_database(
    pg_server: Any,
    pg_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``?witness_url=`` (percent-encoded): the witness schema lives in that database, not
    the ledger's; every opener of the URL (a second Ledger, the CLI) checks against it, so
    a restore of the ledger's whole database (witness schema included) is still caught."""
    from crashproof.cli import main

    elsewhere = pg_server.create_database()
    url = f"{pg_url}?witness_url={quote(elsewhere, safe='')}"
    target = Target(tmp_path / "t.json")
    crash_before_act(url, target)
    sql(pg_url, "CREATE TABLE public.events_backup AS SELECT * FROM crashproof.events")
    with open_ledger(url) as ledger:
        ledger.run(make(target), run_id="r")
    journal = sql(pg_url, "SELECT count(*) FROM crashproof.events WHERE run_id = 'r'")[0][0]
    assert sql(elsewhere, "SELECT generation FROM crashproof_witness.witness") == [(journal,)]
    schemas = {row[0] for row in sql(pg_url, "SELECT nspname FROM pg_namespace")}
    assert "crashproof_witness" not in schemas
    sql(pg_url, "DELETE FROM crashproof.events WHERE run_id = 'r'")  # the database restored
    sql(pg_url, "INSERT INTO crashproof.events SELECT * FROM public.events_backup")
    with open_ledger(url) as ledger, pytest.raises(cp.JournalRolledBack):
        ledger.get_run("r")
    monkeypatch.setenv("CRASHPROOF_KEY", KEY)
    assert main(["check", "--db", url]) == 5
    shown = capsys.readouterr()
    assert "rolled back" in (shown.out + shown.err).lower()
    assert "test-pw" not in shown.out + shown.err
    with pytest.raises(ValueError, match="witness_url must be a postgresql:// URL"):
        open_ledger(f"{pg_url}?witness_url=sqlite%3A%2F%2F%2Fw.db")


def test_bad_witness_settings_are_refused(pg_url: str) -> None:
    with pytest.raises(ValueError, match="lower-case identifier"):
        PostgresWitness(pg_url, schema="Bad-Name")
    unreachable = "postgresql://nobody:pw@127.0.0.1:1/none"
    with pytest.raises(cp.LedgerError, match="cannot open the generation witness") as caught:
        PostgresWitness(unreachable, schema="w", connect_timeout=1)
    assert "pw@" not in str(caught.value)


def test_an_advance_only_raises_and_a_reset_sets(pg_url: str) -> None:
    """advance is one autocommit statement (its set_config only picks the commit's
    flushing): it raises a generation, never lowers one, and skips unknown runs."""
    witness = PostgresWitness(pg_url, schema="only_up_witness")
    try:
        witness.start("r")
        witness.advance("r", 5)
        witness.advance("r", 3)
        assert witness.get("r") == 5
        witness.reset("r", 2)
        assert witness.get("r") == 2
        witness.advance("r", 4)
        assert witness.get("r") == 4
        witness.advance("never-started", 7)
        assert witness.get("never-started") is None
    finally:
        witness.close()
