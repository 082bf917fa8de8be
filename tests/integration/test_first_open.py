"""Processes that open one new SQLite ledger at the same moment (workers started
together) all open it and run: none fails on a lock SQLite refuses to wait for (the
switch to WAL mode) or on tables another one created first. Before the fix, about one
process in seven failed here; the unit tests in test_sqlite_store.py and
test_witness_batching.py pin each cause deterministically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import crashproof as cp

CHILD = Path(__file__).with_name("first_open_child.py")
PROCESSES = 6


def test_processes_opening_one_new_ledger_at_once_all_run(tmp_path: Path) -> None:
    for trial in range(2):
        path = tmp_path / f"trial{trial}" / "runs.db"
        path.parent.mkdir()
        children = [
            subprocess.Popen(
                [sys.executable, str(CHILD), str(path), f"run-{k}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k in range(PROCESSES)
        ]
        outcomes = [child.communicate(timeout=120) for child in children]
        failed = [
            err for child, (_out, err) in zip(children, outcomes, strict=True) if child.returncode
        ]
        assert failed == []
        assert [out.strip() for out, _err in outcomes] == ["7"] * PROCESSES
        ledger = cp.Ledger(f"sqlite:///{path}", key="42" * 32)
        try:
            assert sorted(ledger.check()) == [(f"run-{k}", None) for k in range(PROCESSES)]
        finally:
            ledger.close()
