"""SIGKILL of a real child at a forced sync that the output points of several async runs
on one loop share (runtime/driving/batching.py), on SQLite (before the WAL's fdatasync,
after it, after the witness write) and PostgreSQL (before and after the commit of several
runs' records in one transaction). DESIGN.md §11 after each: every run resumes to the
uninterrupted result (recovery equivalence), one effect per operation id, no effect
without its intent in the journal (an act's tool runs only after its intent commits, the
target never asked twice: unknown outcomes are looked up), and the witness is never
ahead of the journal (the ledger opens, no rollback reported)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parent))
import child_group

CHILD = Path(__file__).parent / "child_group.py"
EXPECTED = [
    [{"text": f"n{n}-{k}"} for k in range(child_group.ACTS)] for n in range(child_group.RUNS)
]


def _intents(url: str, tmp_path: Path) -> set[str]:
    """The operation ids whose intent the journal holds, as the kill left it."""
    if url.startswith("sqlite"):
        with sqlite3.connect(tmp_path / "l.db") as conn:
            rows = conn.execute("SELECT run_id, key FROM events WHERE type = 'act_intent'")
            return {f"{run_id}/{key}" for run_id, key in rows}
    with cp.Ledger(url) as ledger:
        return {
            f"{info.run_id}/{event.key}"
            for info in ledger.runs()
            for event in ledger.journal(info.run_id)
            if event.type.value == "act_intent"
        }


def _kill_and_resume(url: str, tmp_path: Path, spec: str) -> None:
    code = subprocess.run([sys.executable, str(CHILD), url, str(tmp_path), spec]).returncode
    assert code == -signal.SIGKILL, f"the child was not killed at {spec}"
    covered = (tmp_path / "covered").read_text()
    path = tmp_path / "target.json"
    target: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    # Invariants 1 and 7: no effect without its intent; nothing is executed twice.
    assert set(target) <= _intents(url, tmp_path), (spec, covered)
    with cp.Ledger(url) as ledger:  # opens: no rollback, the witness is not ahead
        got = asyncio.run(child_group.drive_all(ledger, child_group.make(tmp_path)))
        statuses = {ledger.get_run(f"r{n}").status for n in range(child_group.RUNS)}
    assert got == EXPECTED, (spec, covered)
    assert statuses == {cp.RunStatus.SUCCEEDED}
    target = json.loads((tmp_path / "target.json").read_text())
    operations = {f"r{n}/post{k}" for n in range(child_group.RUNS) for k in range(child_group.ACTS)}
    assert set(target) == operations  # invariant 2: one effect per operation id
    assert {note["n"] for note in target.values()} == {1}, (spec, covered)  # asked once


def test_the_grouped_syncs_cover_several_runs(tmp_path: Path) -> None:
    """Without a kill, the runs' output points share syncs: the test below kills inside
    syncs that cover several runs, not one run's own."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    widths: list[int] = []
    with cp.Ledger(url, durability="output") as ledger:
        advance = ledger._store.on_durable  # type: ignore[attr-defined]

        def durable(notes: dict[str, int]) -> None:
            widths.append(len(notes))
            advance(notes)

        ledger._store.on_durable = durable  # type: ignore[attr-defined]
        got = asyncio.run(child_group.drive_all(ledger, child_group.make(tmp_path)))
    assert got == EXPECTED
    # How many syncs there are depends on how fast the disk answers (a quiet machine's
    # fsync can end before the next run's output point arrives); that some sync covers
    # several runs does not. The count is pinned where it is deterministic:
    # tests/integration/test_output_durability.py (64 runs, syncs <= output points / 8).
    assert max(widths) > 1, widths


# Which shared sync (or batch) is hit: the first few in `make test`, more in `make chaos`.
KILLS = int(os.environ.get("GROUP_KILLS", "2"))


@pytest.mark.parametrize("where", ["before", "synced", "witnessed"])
@pytest.mark.parametrize("at", range(2, 2 + KILLS))
def test_sqlite(at: int, where: str, tmp_path: Path) -> None:
    _kill_and_resume(f"sqlite:///{tmp_path / 'l.db'}", tmp_path, f"sync:{at}:{where}")


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("at", range(1, KILLS))
def test_postgres(at: int, where: str, pg_url: str, tmp_path: Path) -> None:
    _kill_and_resume(pg_url, tmp_path, f"batch:{at}:{where}")
