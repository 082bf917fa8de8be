"""SQLite checkpoints of an async loop's commits run in a thread of their own
(store/checkpointing.py): the loop never copies the log into the database file itself,
every run's journal stays whole, the log stays bounded, and a checkpointer that falls
behind hands the checkpoints back to the commits."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.store.checkpointing import BEHIND, Checkpointer

RUNS, STEPS = 48, 12


async def _double(i: int) -> int:
    await asyncio.sleep(0)
    return 2 * i


@cp.workflow("steps", version="1")
async def steps(ctx: cp.AsyncContext, n: int) -> list[int]:
    return [await ctx.step("double", _double, i) for i in range(n)]


def _wal(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


def test_the_loops_checkpoints_run_in_their_own_thread_and_the_log_stays_bounded(
    tmp_path: Path,
) -> None:
    db = tmp_path / "l.db"
    ran_in: list[str] = []
    largest = 0
    with cp.Ledger(f"sqlite:///{db}") as ledger:
        checkpoints: Checkpointer = ledger.store._checkpoints  # type: ignore[attr-defined]
        checkpoints.threshold = 40  # records: several checkpoints in this small workload
        inner = checkpoints._checkpoint

        def traced() -> bool:
            ran_in.append(threading.current_thread().name)
            return inner()

        checkpoints._checkpoint = traced  # type: ignore[method-assign]

        async def all_runs() -> list[Any]:
            nonlocal largest
            runs = [ledger.run_async(steps, run_id=f"r{k}", n=STEPS) for k in range(RUNS)]
            done = asyncio.gather(*runs)
            while not done.done():  # the log's size while the loop commits
                largest = max(largest, _wal(db).stat().st_size if _wal(db).exists() else 0)
                await asyncio.sleep(0.001)
            return await done

        results = asyncio.run(all_runs())
        assert results == [[2 * i for i in range(STEPS)]] * RUNS
        assert ran_in
        assert set(ran_in) == {"crashproof-checkpoint"}, ran_in
        for k in range(RUNS):  # every MAC and the chain verified on the way
            assert len(ledger.journal(f"r{k}")) == STEPS + 2
    # The log never held the whole workload: checkpoints let it start over. (Written
    # whole it takes ~RUNS * STEPS pages; a checkpoint is due every 40 records.)
    assert 0 < largest < RUNS * STEPS * 4096 / 2, largest
    # Closed: the checkpointer's connection first, so the last one removed the log.
    assert not _wal(db).exists()
    with cp.Ledger(f"sqlite:///{db}") as reopened:
        reopened.register(steps)
        assert asyncio.run(reopened.resume_async("r0")) == [2 * i for i in range(STEPS)]


def test_a_checkpointer_that_falls_behind_hands_checkpoints_back_to_the_commits(
    tmp_path: Path,
) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        ledger.run(cp.workflow("one")(lambda ctx: ctx.step("s", lambda: 1)), run_id="r")
    checkpoints = Checkpointer(tmp_path / "l.db", 5.0, threading.Lock(), threshold=10)
    try:
        with checkpoints.paused():  # its thread cannot run a checkpoint meanwhile
            for _ in range(BEHIND):
                assert checkpoints.defer()
                checkpoints.wrote(10)
            assert not checkpoints.defer()  # the commits checkpoint themselves again
        deadline = time.monotonic() + 10
        while not checkpoints.defer():  # caught up once released
            assert time.monotonic() < deadline, "the checkpointer never caught up"
            time.sleep(0.01)
        assert checkpoints.checkpoints >= 1
    finally:
        checkpoints.close()
    assert not checkpoints.defer()  # closed: nothing is left to a thread that is gone
