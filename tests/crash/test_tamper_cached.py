"""A byte changed inside a journal prefix that was verified and kept for reuse (#42).

A SQLite store keeps the journal its last whole load verified and lets the next load of
that run verify only what follows (a drive reads its journal for the verdict, then under
its lease). The reused records are the verified ones, never bytes read again; the reuse
happens once, so the load after it, a new ledger (the next open) and a resume in a new
process running under ``python -O`` all read and verify the whole chain and refuse it.
The run is made by a child process really killed (SIGKILL) inside its last step."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import crashproof as cp

KEY = "5e" * 32
STEPS = 30

CHILD = """
import os, signal, sys

import crashproof as cp

db, marks, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])


def body(k):
    with open(marks, "a") as f:
        f.write(f"{k}\\n")
    if k == steps - 1 and os.environ.get("KILL_LAST"):
        os.kill(os.getpid(), signal.SIGKILL)
    return f"+line-{k % 10}"


@cp.workflow("tamper", version="1")
def flow(ctx):
    return [ctx.step(f"s{k}", body, k) for k in range(steps)]


ledger = cp.Ledger(f"sqlite:///{db}", key=os.environ["KEY"])
ledger.register(flow)
try:
    ledger.resume("r") if os.environ.get("RESUME") else ledger.run(flow, run_id="r")
except cp.JournalTampered as exc:
    print("tampered:", exc)
    sys.exit(3)
"""


def child(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    argv = [sys.executable, "-O", str(script), str(tmp_path / "l.db"), str(tmp_path / "marks")]
    return subprocess.run(
        [*argv, str(STEPS)],
        env={**os.environ, "KEY": KEY, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_byte_changed_in_a_kept_prefix_is_caught_after_its_one_reuse(tmp_path: Path) -> None:
    crashed = child(tmp_path, KILL_LAST="1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    marks = tmp_path / "marks"
    assert marks.read_text().split() == [str(k) for k in range(STEPS)]

    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY)
    verified = ledger.journal("r")  # verified whole: kept for one reuse
    assert len(verified) == STEPS  # the start and every step but the killed one
    conn = sqlite3.connect(tmp_path / "l.db")
    conn.execute("UPDATE events SET value = '\"+line-8\"' WHERE run_id = 'r' AND seq = 4")
    conn.commit()
    conn.close()

    again = ledger.journal("r")  # the reuse: the records verified above, nothing re-read
    assert [e.value_json for e in again] == [e.value_json for e in verified]
    assert again[4].value == "+line-3"
    with pytest.raises(cp.JournalTampered, match="record 4"):
        ledger.journal("r")  # the load after the reuse verifies everything
    ledger.close()

    reopened = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY)
    with pytest.raises(cp.JournalTampered, match="record 4"):
        reopened.journal("r")  # the next open
    reopened.close()

    marks.write_text("")
    resumed = child(tmp_path, RESUME="1")  # a resume in a new process, under python -O
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr
    assert "record 4" in resumed.stdout
    assert marks.read_text() == "", "a step ran on a tampered journal"
