"""Text deltas with a real crash (#22): a child process whose step returns the whole
growing history is killed by SIGKILL (at a commit of a turn's delta, or at whatever
moment a timer picks while it writes), and the run resumed here returns every turn
exactly, with no delta stored whose base is missing."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.journal.records import EventType

CHILD = """
import sys

import crashproof as cp


def message(t):
    return {"role": "user", "content": f"turn {t}: " + "x" * 2000}


@cp.workflow("delta-kill", version="1")
def grow(ctx, turns):
    kept = []
    for t in range(turns):
        kept = ctx.step(f"turn{t}", lambda h=kept, t=t: [*h, message(t)])
    return len(kept)


if __name__ == "__main__":
    point = sys.argv[2]
    points = None if point == "-" else cp.CrashPoints(match=point, action="sigkill")
    cp.Ledger(f"sqlite:///{sys.argv[1]}", crash_points=points).run(
        grow, run_id="A", turns=int(sys.argv[3])
    )
"""


def _child(tmp_path: Path, point: str, turns: int) -> tuple[Path, list[str]]:
    db, child = tmp_path / "l.db", tmp_path / "child.py"
    child.write_text(CHILD, encoding="utf-8")
    return db, [sys.executable, str(child), str(db), point, str(turns)]


def _ledger(db: Path) -> tuple[cp.Ledger, dict[str, Any]]:
    """A new ledger that knows the child's workflow (its code, loaded here too)."""
    namespace: dict[str, Any] = {"__name__": "delta_child"}
    exec(compile(CHILD, "delta_child", "exec"), namespace)
    ledger = cp.Ledger(f"sqlite:///{db}")
    ledger.register(namespace["grow"])
    return ledger, namespace


def _resumed(db: Path, turns: int) -> None:
    ledger, child = _ledger(db)
    with ledger:
        assert ledger.resume("A") == turns
        done = {
            e.key: e.value for e in ledger.store.load_events("A") if e.type is EventType.STEP_DONE
        }
    history = [child["message"](t) for t in range(turns)]
    assert [done[f"turn{t}"] for t in range(turns)] == [history[: t + 1] for t in range(turns)]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        orphans, deltas = conn.execute(
            "SELECT sum(NOT EXISTS (SELECT 1 FROM blobs AS a WHERE a.digest = b.base)), "
            "count(*) FROM blobs AS b WHERE b.base IS NOT NULL"
        ).fetchone()
    assert orphans == 0
    assert deltas > turns // 2  # the resumed drive went on storing deltas
    assert main(["check", "--db", f"sqlite:///{db}"]) == 0


@pytest.mark.parametrize(
    "point", ["before_commit[step_done:turn11]", "after_commit[step_done:turn11]"]
)
def test_sqlite_a_kill_at_a_delta_commit_resumes_exactly(tmp_path: Path, point: str) -> None:
    db, argv = _child(tmp_path, point, 20)
    done = subprocess.run(argv, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    _resumed(db, 20)


def test_sqlite_a_kill_at_any_moment_of_a_long_run_resumes_exactly(tmp_path: Path) -> None:
    turns = 400
    db, argv = _child(tmp_path, "-", turns)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            if db.exists() and os.path.getsize(db) + _wal(db) > 400_000:
                break  # well into its deltas: a hundred turns or so
        assert proc.poll() is None, "the child ended before it was killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    _resumed(db, turns)


def _wal(db: Path) -> int:
    wal = db.with_name(db.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0
