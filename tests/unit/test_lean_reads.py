"""Readers that fold a run without its steps' results (get_run, runs, check) still
verify every record's MAC, the results' included, before anything is parsed."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

import crashproof as cp


def test_a_tampered_step_result_fails_get_run_runs_and_check(tmp_path: Path) -> None:
    path = tmp_path / "lean.db"
    with cp.Ledger(f"sqlite:///{path}") as ledger:

        @ledger.workflow("w", version="1")
        def w(ctx: cp.Context) -> int:
            return int(ctx.step("s", lambda: 41)) + 1

        assert ledger.run(w, run_id="r") == 42
        assert ledger.get_run("r").steps[0].status is cp.StepStatus.SUCCEEDED
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE events SET value = '40' WHERE key = 's'")
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        with pytest.raises(cp.IntegrityError):
            ledger.get_run("r")
        with pytest.raises(cp.IntegrityError):
            ledger.runs()
        [(run_id, problem)] = ledger.check()
        assert run_id == "r"
        assert problem is not None
