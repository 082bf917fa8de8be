"""Concurrent witness advances combine: runs released by one group sync share one
witness commit, and every advance returns only once its generation is written."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from crashproof.errors import LedgerError
from crashproof.integrity.witness import SQLiteWitness

RUNS = 8


def _generations(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT run_id, generation FROM witness").fetchall())
    finally:
        conn.close()


def test_advances_that_wait_together_share_one_commit(tmp_path: Path) -> None:
    witness = SQLiteWitness(tmp_path / "l.db.witness")
    for k in range(RUNS):
        witness.start(f"r{k}")
    statements: list[str] = []
    first = threading.Event()
    asked = witness._asked  # (the starts asked too)

    def trace(sql: str) -> None:
        statements.append(sql.split()[0].upper())
        if len(statements) == 1:  # hold the first write until every run has asked
            first.set()
            deadline = time.monotonic() + 10
            while witness._asked < asked + RUNS and time.monotonic() < deadline:
                time.sleep(0.005)

    witness._conn.set_trace_callback(trace)
    returned: list[str] = []

    def advance(k: int) -> None:
        witness.advance(f"r{k}", 10 + k)
        returned.append(f"r{k}")

    threads = [threading.Thread(target=advance, args=(0,))]
    threads[0].start()
    assert first.wait(10)
    threads += [threading.Thread(target=advance, args=(k,)) for k in range(1, RUNS)]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    witness._conn.set_trace_callback(None)
    assert sorted(returned) == sorted(f"r{k}" for k in range(RUNS))
    assert _generations(tmp_path / "l.db.witness") == {f"r{k}": 10 + k for k in range(RUNS)}
    # The first write carried r0 alone; the seven that asked meanwhile share one commit.
    assert statements == ["UPDATE", "BEGIN", *["UPDATE"] * (RUNS - 1), "COMMIT"]
    witness.close()


def test_an_advance_never_lowers_and_the_highest_ask_wins(tmp_path: Path) -> None:
    witness = SQLiteWitness(tmp_path / "l.db.witness")
    witness.start("r")
    witness.advance("r", 5)
    witness.advance("r", 3)
    assert witness.get("r") == 5
    witness.reset("r", 2)  # the operator's re-anchor still sets it whatever it was
    assert witness.get("r") == 2
    witness.close()


def test_a_failed_write_is_retried_by_the_next_advance(tmp_path: Path) -> None:
    path = tmp_path / "l.db.witness"
    witness = SQLiteWitness(path)
    witness.start("r")
    blocker = sqlite3.connect(path, isolation_level=None, timeout=0)
    witness._conn.execute("PRAGMA busy_timeout=0")
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the witness
    with pytest.raises(LedgerError, match="cannot update the witness"):
        witness.advance("r", 7)
    blocker.execute("ROLLBACK")
    blocker.close()
    assert witness.get("r") == 0  # nothing was written, and no ask was taken for done
    witness.advance("r", 4)  # carries the failed ask (7) with it
    assert witness.get("r") == 7
    witness.close()


def test_an_advance_before_the_run_started_is_asked_again_after(tmp_path: Path) -> None:
    """An advance of a run the witness has no row for changes nothing; once the run is
    started, the same advance is written (not skipped as already made)."""
    witness = SQLiteWitness(tmp_path / "l.db.witness")
    witness.advance("r", 4)
    assert witness.get("r") is None
    witness.start("r")
    witness.advance("r", 4)
    assert witness.get("r") == 4
    witness.close()


def test_a_witness_file_locked_before_it_is_in_wal_mode_is_waited_for(tmp_path: Path) -> None:
    """Two processes opening one new ledger open its witness file at once too: switching
    it to WAL mode waits for the other's lock instead of failing at once."""
    path = tmp_path / "runs.db.witness"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # not yet in WAL mode, its write lock held
    opened: list[SQLiteWitness] = []
    failures: list[BaseException] = []

    def open_witness() -> None:
        try:
            opened.append(SQLiteWitness(path))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=open_witness)
    thread.start()
    time.sleep(0.3)
    holder.execute("ROLLBACK")
    holder.close()
    thread.join()
    try:
        assert failures == []
        opened[0].start("r")
        assert opened[0].get("r") == 0
    finally:
        for witness in opened:
            witness.close()
