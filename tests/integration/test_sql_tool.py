"""The SQL tools against real databases (a SQLite file, the test PostgreSQL server): a
migration applied once ever, a changed one refused, a failing statement rolled back and
recorded as the act's failure, a key reused with another intent a conflict, a busy
connection refused. The crash windows are tests/crash/test_sigkill_sql.py."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.runtime.steps.act_records import intent_digest
from crashproof.tools.migrations import Migrations
from crashproof.tools.port import Call
from crashproof.tools.sql import Sql

pytestmark = pytest.mark.timeout(60)

INIT = "CREATE TABLE items (label TEXT NOT NULL);\nINSERT INTO items VALUES ('one');\n"
MORE = "INSERT INTO items VALUES ('two'); -- a ; in a comment\nINSERT INTO items VALUES (';');\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "app.db")
    url: str = request.getfixturevalue("pg_url")
    return "postgresql", url


def _connect(target: tuple[str, str]) -> Any:
    engine, where = target
    if engine == "sqlite":
        return sqlite3.connect(where, check_same_thread=False)
    import psycopg

    return psycopg.connect(where)


def _rows(target: tuple[str, str], sql: str) -> list[tuple[Any, ...]]:
    conn = _connect(target)
    try:
        rows: list[tuple[Any, ...]] = conn.execute(sql).fetchall()
        return rows
    finally:
        conn.rollback()
        conn.close()


def _workflow(target: tuple[str, str], directory: Path) -> Any:
    @cp.workflow("deploy", version="1")
    def deploy(ctx: cp.Context) -> list[Any]:
        conn = _connect(target)
        try:
            return Migrations(conn, directory).apply(ctx)
        finally:
            conn.close()

    return deploy


def _files(directory: Path, **files: str) -> Path:
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / f"{name}.sql").write_text(text, encoding="utf-8")
    return directory


def test_migrations_apply_once_across_runs(target: tuple[str, str], tmp_path: Path) -> None:
    directory = _files(tmp_path / "m", **{"0001_init": INIT, "0002_more": MORE})
    deploy = _workflow(target, directory)
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        first = ledger.run(deploy, run_id="A")
        assert [r["rows_affected"] for r in first] == [1, 2]
        assert [r["statements"] for r in first] == [2, 2]
        assert ledger.run(deploy, run_id="B") == first  # found, not applied again
        _files(directory, **{"0003_last": "INSERT INTO items VALUES ('three');"})
        third = ledger.run(deploy, run_id="C")
    assert third[:2] == first
    assert third[2]["migration"] == "0003_last.sql"
    labels = sorted(r[0] for r in _rows(target, "SELECT label FROM items"))
    assert labels == [";", "one", "three", "two"]
    receipts = _rows(
        target, "SELECT operation_id, run_id, kind, committed_at FROM crashproof_receipts"
    )
    assert sorted(r[:3] for r in receipts) == [
        ("migration:0001_init.sql", "A", "migration"),
        ("migration:0002_more.sql", "A", "migration"),
        ("migration:0003_last.sql", "C", "migration"),
    ]
    clock = _rows(
        target,
        "SELECT (julianday('now') - 2440587.5) * 86400.0"
        if target[0] == "sqlite"
        else "SELECT extract(epoch from clock_timestamp())::float8",
    )[0][0]
    assert all(0 <= clock - r[3] < 600 for r in receipts)  # the database's clock


def test_a_changed_migration_freezes_and_is_not_applied(
    target: tuple[str, str], tmp_path: Path
) -> None:
    directory = _files(tmp_path / "m", **{"0001_init": INIT})
    deploy = _workflow(target, directory)
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        ledger.run(deploy, run_id="A")
        _files(directory, **{"0001_init": INIT + "INSERT INTO items VALUES ('again');"})
        with pytest.raises(cp.RunFrozen, match="an applied migration never runs again"):
            ledger.run(deploy, run_id="B")
    assert _rows(target, "SELECT label FROM items") == [("one",)]


def test_a_failing_statement_rolls_back_and_fails_the_act(
    target: tuple[str, str], tmp_path: Path
) -> None:
    broken = "INSERT INTO items VALUES ('half');\nINSERT INTO missing VALUES (1);\n"
    directory = _files(tmp_path / "m", **{"0001_init": INIT, "0002_broken": broken})
    deploy = _workflow(target, directory)
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        with pytest.raises(cp.RunFailed) as failed:
            ledger.run(deploy, run_id="A")
        message = str(failed.value)
        assert "statement failed at line 2: " in message, message
        assert "missing" in message
        assert "rolled back, nothing applied" in message
        assert "\n" not in message
    # Nothing of the failed file, no receipt for it; the first file stays applied.
    assert _rows(target, "SELECT label FROM items") == [("one",)]
    assert [r[0] for r in _rows(target, "SELECT operation_id FROM crashproof_receipts")] == [
        "migration:0001_init.sql"
    ]


def test_the_cli_reports_a_failing_migration_in_one_line_and_retries_it(
    tmp_path: Path,
) -> None:
    """`crashproof run` prints one line and what to do (exit 1); the fixed file then
    applies on `crashproof retry`, once."""
    _files(tmp_path / "m", **{"0001_init": INIT, "0002_next": "INSERT INTO itemz VALUES (2);"})
    (tmp_path / "app.py").write_text(
        "import sqlite3\nimport crashproof as cp\n"
        "from crashproof.tools.migrations import Migrations\n\n"
        "@cp.workflow('deploy', version='1')\n"
        "def deploy(ctx):\n"
        "    conn = sqlite3.connect('app.db')\n"
        "    try:\n"
        "        return [r['rows_affected'] for r in Migrations(conn, 'm').apply(ctx)]\n"
        "    finally:\n"
        "        conn.close()\n",
        encoding="utf-8",
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "crashproof", *args, "--db", "sqlite:///runs.db"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    failed = cli("run", "app:deploy", "--run-id", "A")
    assert failed.returncode == 1, failed.stderr
    assert "Traceback" not in failed.stderr
    assert "no such table: itemz" in failed.stderr
    assert "crashproof retry A" in failed.stderr, failed.stderr
    _files(tmp_path / "m", **{"0002_next": "INSERT INTO items VALUES ('two');"})
    done = cli("retry", "A", "--app", "app")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [1, 1]
    assert _rows(("sqlite", str(tmp_path / "app.db")), "SELECT label FROM items") == [
        ("one",),
        ("two",),
    ]


def test_transaction_control_is_refused_before_anything_runs(
    target: tuple[str, str], tmp_path: Path
) -> None:
    @cp.workflow("control", version="1")
    def control(ctx: cp.Context) -> Any:
        conn = _connect(target)
        try:
            return ctx.act(
                "t",
                Sql(conn),
                sql="CREATE TABLE t (x INTEGER); COMMIT; INSERT INTO t VALUES (1);",
            )
        finally:
            conn.close()

    refused = pytest.raises(cp.RunFailed, match="remove BEGIN/COMMIT/ROLLBACK")
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger, refused:
        ledger.run(control, run_id="A")
    tables = _rows(
        target,
        "SELECT name FROM sqlite_master"
        if target[0] == "sqlite"
        else "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
    )
    assert tables == []


def test_a_key_reused_with_another_intent_is_a_conflict(
    target: tuple[str, str], tmp_path: Path
) -> None:
    """Two ledgers, one run id, one step: the second act's intent differs, so the
    receipt it finds is not its own (frozen for review, nothing applied)."""

    def workflow(label: str) -> Any:
        @cp.workflow("log", version="1")
        def log(ctx: cp.Context) -> Any:
            conn = _connect(target)
            try:
                ctx.act("table", Sql(conn), sql="CREATE TABLE IF NOT EXISTS log (x TEXT)")
                return ctx.act("log", Sql(conn), sql=f"INSERT INTO log VALUES ({label})")
            finally:
                conn.close()

        return log

    with cp.Ledger(f"sqlite:///{tmp_path}/one.db") as ledger:
        assert ledger.run(workflow("'a'"), run_id="A") == {"rows_affected": 1, "statements": 1}
    conflict = pytest.raises(cp.RunFrozen, match="receipt conflict at act 'log'")
    with cp.Ledger(f"sqlite:///{tmp_path}/two.db") as ledger, conflict:
        ledger.run(workflow("'b'"), run_id="A")
    assert _rows(target, "SELECT x FROM log") == [("a",)]


def test_lookup_answers_from_the_receipt_table(target: tuple[str, str]) -> None:
    conn = _connect(target)
    tool = Sql(conn)
    params = {"sql": "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1)"}

    def call(params: dict[str, Any]) -> Call:
        digest = intent_digest(tool, params, "s")
        return Call(run_id="R", step="s", operation_id="R/s", intent_digest=digest, params=params)

    try:
        assert tool.lookup(call(params)) is None  # no table yet: not done
        receipt = tool.execute(call(params))
        assert receipt.result == {"rows_affected": 1, "statements": 2}
        assert receipt.intent_digest == call(params).intent_digest
        found = tool.lookup(call(params))
        assert found is not None
        assert found.result == receipt.result
        assert found.committed_at == receipt.committed_at
        again = tool.execute(call(params))  # a repeat finds the receipt: nothing runs
        assert again.result == receipt.result
        other = {"sql": "INSERT INTO t VALUES (2)"}
        stored = tool.lookup(call(other))
        assert stored is not None
        assert stored.intent_digest == call(params).intent_digest
        assert _rows(target, "SELECT x FROM t") == [(1,)]
    finally:
        conn.close()


def test_a_connection_with_an_open_transaction_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.commit()
    conn.execute("INSERT INTO t VALUES (1)")  # the caller's, uncommitted

    @cp.workflow("busy", version="1")
    def busy(ctx: cp.Context) -> Any:
        return ctx.act("s", Sql(conn), sql="INSERT INTO t VALUES (2)")

    refused = pytest.raises(cp.RunFailed, match="has a transaction open")
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger, refused:
        ledger.run(busy, run_id="A")
    assert conn.in_transaction  # the caller's work is neither committed nor lost
    conn.rollback()
    conn.close()


def test_an_async_workflow_runs_the_act_in_a_worker_thread(tmp_path: Path) -> None:
    directory = _files(tmp_path / "m", **{"0001_init": INIT})

    @cp.workflow("deploy-async", version="1")
    async def deploy(ctx: cp.AsyncContext) -> list[Any]:
        conn = sqlite3.connect(tmp_path / "app.db", check_same_thread=False)
        migrations = Migrations(conn, directory)
        try:
            return [await ctx.act(name, migrations, **p) for name, p in migrations.plan()]
        finally:
            conn.close()

    async def main() -> list[Any]:
        with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
            out: list[Any] = await ledger.run_async(deploy, run_id="A")
            return out

    assert [r["rows_affected"] for r in asyncio.run(main())] == [1]


def test_a_stale_fencing_token_applies_nothing(target: tuple[str, str]) -> None:
    """A worker whose token is lower than one on the run's receipts (a newer owner has
    written) is stopped before its statements run."""
    conn = _connect(target)
    tool = Sql(conn)

    def call(step: str, sql: str, token: int) -> Call:
        params = {"sql": sql}
        return Call(
            run_id="R",
            step=step,
            operation_id=f"R/{step}",
            intent_digest=intent_digest(tool, params, step),
            params=params,
            fencing_token=token,
        )

    try:
        tool.execute(call("new", "CREATE TABLE t (x INTEGER)", 5))
        with pytest.raises(cp.StaleLeaseError, match="fencing token 5, this worker's is 3"):
            tool.execute(call("old", "INSERT INTO t VALUES (1)", 3))
        assert tool.lookup(call("old", "INSERT INTO t VALUES (1)", 3)) is None
        tool.execute(call("next", "INSERT INTO t VALUES (2)", 5))  # the owner goes on
        assert _rows(target, "SELECT x FROM t") == [(2,)]
    finally:
        conn.close()
