"""A migration killed by SIGKILL (a real child process) before its commit, during it,
and after it but before the journal records the receipt, on SQLite and PostgreSQL:
at every kill the database holds each migration's change exactly when it holds its
receipt row, and after the resume (in this process) every change is there once.

Deterministic points: the intent journaled and nothing run; all statements and the
receipt row written but not committed; committed in the database, not in the journal;
the journal's receipt commit about to happen. Then random kills over the whole run
(``SQL_KILLS`` of them per engine; ``make chaos`` runs more), some of which land in the
commit itself."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
import zygote as zygotes

sys.path.insert(0, str(Path(__file__).parent))
import child_sql

CHILD = Path(__file__).parent / "child_sql.py"
FILL = 300  # rows the second migration inserts, one statement each
KILLS = int(os.environ.get("SQL_KILLS", "3"))
MIGRATIONS = {
    "0001_init.sql": (
        "CREATE TABLE counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL);\n"
        "CREATE TABLE items (label TEXT NOT NULL);\n"
        "INSERT INTO counters VALUES ('m1', 1);\n"
    ),
    "0002_fill.sql": "".join(
        f"INSERT INTO items (label) VALUES ('fill {i}');\n" for i in range(FILL)
    ),
    "0003_bump.sql": (
        "-- not idempotent: applied twice, m1 would be 3\n"
        "UPDATE counters SET n = n + 1 WHERE name = 'm1';\n"
        "INSERT INTO counters VALUES ('m3', 1);\n"
    ),
}
FILL_KEY = "migrate:0002_fill.sql"
POINTS = [
    f"after_commit[act_intent:{FILL_KEY}]",  # intent only: nothing ran
    f"inside[act:{FILL_KEY}:statements]",  # all run, receipt row written, no commit
    f"inside[act:{FILL_KEY}:committed]",  # committed in the database only
    f"before_commit[step_done:{FILL_KEY}]",  # the journal's receipt about to commit
    "inside[act:log:committed]",  # the plain Sql act, committed, not journaled
]
RECEIPTS = {f"migration:{name}" for name in MIGRATIONS} | {"A/log"}


@pytest.fixture(scope="module")
def zygote() -> Iterator[subprocess.Popen[str]]:
    yield from zygotes.started(CHILD)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _target(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if engine == "sqlite":
        return str(tmp_path / "app.db")
    url: str = request.getfixturevalue("pg_server").create_database()
    return url


def _directory(tmp_path: Path) -> Path:
    directory = tmp_path / "migrations"
    directory.mkdir(exist_ok=True)
    for name, text in MIGRATIONS.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def _query(engine: str, target: str, sql: str) -> list[tuple[Any, ...]]:
    if engine == "sqlite":
        with sqlite3.connect(target) as conn:
            rows = conn.execute(sql).fetchall()
        conn.close()
        return rows
    import psycopg

    with psycopg.connect(target, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def _state(engine: str, target: str) -> dict[str, Any]:
    """What the database holds, checked for "change exactly when receipt"."""
    tables = {
        r[0]
        for r in _query(
            engine,
            target,
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            if engine == "sqlite"
            else "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
        )
    }
    receipts = set()
    if "crashproof_receipts" in tables:
        receipts = {
            r[0] for r in _query(engine, target, "SELECT operation_id FROM crashproof_receipts")
        }
    state: dict[str, Any] = {"receipts": receipts, "init": "counters" in tables}
    if state["init"]:
        labels = [r[0] for r in _query(engine, target, "SELECT label FROM items")]
        counters = dict(_query(engine, target, "SELECT name, n FROM counters"))
        state.update(
            fill=sum(label.startswith("fill ") for label in labels),
            act=labels.count("act"),
            m1=counters.get("m1"),
            m3=counters.get("m3"),
        )
    assert receipts <= RECEIPTS, receipts
    assert state["init"] == ("migration:0001_init.sql" in receipts), state
    if state["init"]:
        assert state["fill"] == (FILL if "migration:0002_fill.sql" in receipts else 0), state
        bumped = "migration:0003_bump.sql" in receipts
        assert (state["m1"], state["m3"]) == ((2, 1) if bumped else (1, None)), state
        assert state["act"] == (1 if "A/log" in receipts else 0), state
    return state


def _resume(ledger: str, engine: str, target: str, directory: Path) -> list[int]:
    with cp.Ledger(ledger) as runs:
        out: list[int] = runs.run(
            child_sql.migrate, run_id="A", engine=engine, target=target, directory=str(directory)
        )
    return out


def _kill_and_resume(
    zygote: subprocess.Popen[str], tmp_path: Path, engine: str, target: str, how: str
) -> dict[str, Any]:
    directory = _directory(tmp_path)
    ledger = f"sqlite:///{tmp_path}/runs.db"
    code = zygotes.kill(zygote, ledger, engine, target, directory, how)
    seen = _state(engine, target)  # change exactly when receipt, at the kill
    out = _resume(ledger, engine, target, directory)
    assert out == [1, FILL, 2, 1], out
    after = _state(engine, target)
    assert after["receipts"] == RECEIPTS
    assert (after["fill"], after["act"], after["m1"], after["m3"]) == (FILL, 1, 2, 1)
    return {"code": code, "seen": seen}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", POINTS)
def test_a_migration_killed_at_each_point_applies_once(
    zygote: subprocess.Popen[str],
    tmp_path: Path,
    engine: str,
    point: str,
    request: pytest.FixtureRequest,
) -> None:
    target = _target(engine, tmp_path, request)
    done = _kill_and_resume(zygote, tmp_path, engine, target, f"point={point}")
    assert done["code"] == -signal.SIGKILL, point
    fill_done = "migration:0002_fill.sql" in done["seen"]["receipts"]
    # Before the commit nothing of the file is there; after it, all of it is.
    assert fill_done == (
        ":committed]" in point or point.startswith("before_commit") or "log" in point
    )


def _trace(path: Path) -> list[tuple[float, str]]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [(float(at), point) for at, point in (line.split(" ", 1) for line in lines)]


@pytest.mark.timeout(120 + 6 * KILLS)  # a kill and its resume: about 2 s on a loaded machine
def test_random_kills_apply_each_change_once(
    zygote: subprocess.Popen[str], tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    """Half the kills anywhere in the migrations' span, half around the big file's
    commit; each is tallied by the last crash point it passed (after ``statements``, before
    ``committed``: inside the commit)."""
    rng = random.Random(int(os.environ.get("SQL_SEED", "44")))
    reference = tmp_path / "reference"
    reference.mkdir()
    measured = reference / "trace"
    target = _target(engine, reference, request)
    done = _kill_and_resume(zygote, reference, engine, target, f"measure={measured}")
    assert done["code"] == 0
    times = dict((point, at) for at, point in _trace(measured))
    span = max(times.values())  # from the first migration's begin to the last point
    commit = (
        times[f"inside[act:{FILL_KEY}:statements]"],
        times[f"inside[act:{FILL_KEY}:committed]"],
    )
    landed: Counter[str] = Counter()
    for n in range(KILLS):
        case = tmp_path / str(n)
        case.mkdir()
        if n % 2:
            delay = rng.uniform(commit[0] - 0.002, commit[1] + 0.002)
        else:
            delay = rng.uniform(0.0, span)
        how = f"delay={max(delay, 0.0):.4f}:{case / 'trace'}"
        done = _kill_and_resume(zygote, case, engine, _target(engine, case, request), how)
        last = (_trace(case / "trace") or [(0.0, "none")])[-1][1]
        if done["code"] != -signal.SIGKILL:
            landed["finished first"] += 1
        elif last.endswith(":statements]"):
            landed["in a commit"] += 1
        else:
            landed[f"{len(done['seen']['receipts'])} receipts"] += 1
    print(f"{engine}: {KILLS} kills over {span:.3f} s: {dict(sorted(landed.items()))}")
    assert landed["finished first"] < KILLS or KILLS == 0
