"""Leases under a busy event loop (issue #38): 1,024 async runs in one loop keep their
leases while the loop is blocked for longer than a lease lasts: their renewals run in a
thread that does not need the loop. (A process that really stops, renewal thread and
all, is still fenced out: tests/integration/test_worker_processes.py, SIGSTOP.)"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import crashproof as cp
from crashproof.errors import LeaseHeld
from crashproof.store.sqlite import SQLiteStore

RUNS = 1024
TTL = 1.0  # seconds: renewed every third of it
BLOCK = 2.5 * TTL  # the loop does nothing else for this long
PROBED = 64  # runs another worker tries to claim while the loop is blocked


class _LostLeases(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lost: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "lease lost":
            self.lost.append(getattr(record, "run_id", "?"))


def test_a_blocked_loop_keeps_the_leases_of_its_1024_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    entered = 0
    gate: asyncio.Event | None = None
    blocked = threading.Event()
    stolen: list[str] = []
    refused: list[str] = []

    async def think(i: int) -> cp.Decision:
        await asyncio.sleep(0.01)
        busy = time.perf_counter() + 0.0005  # a little CPU on the loop per decision
        while time.perf_counter() < busy:
            pass
        return cp.Decision({"i": i}, model="m")

    @cp.workflow("lease-busy")
    async def agent(ctx: cp.AsyncContext) -> int:
        nonlocal entered
        assert gate is not None
        await ctx.decide("first", think, 0)
        entered += 1
        if ctx.run_id == "r0":
            while entered < RUNS:  # every run is under its lease, mid-run
                await asyncio.sleep(0.01)
            blocked.set()
            time.sleep(BLOCK)  # a CPU-bound step, as far as the loop can tell
            gate.set()
        await gate.wait()
        await ctx.decide("second", think, 1)
        return 1

    def another_worker() -> None:
        """Claims runs of the blocked loop once their leases would have run out unless
        renewed: each claim must find the lease live (LeaseHeld)."""
        if not blocked.wait(120):
            return
        time.sleep(1.5 * TTL)
        store = SQLiteStore(tmp_path / "l.db")
        try:
            for k in range(1, RUNS, RUNS // PROBED):
                try:
                    store.claim(f"r{k}", "other-host:1:cafe", TTL)
                    stolen.append(f"r{k}")
                except LeaseHeld:
                    refused.append(f"r{k}")
        finally:
            store.close()

    async def main(ledger: cp.Ledger) -> list[object]:
        nonlocal gate
        gate = asyncio.Event()
        runs = [ledger.run_async(agent, run_id=f"r{k}") for k in range(RUNS)]
        return await asyncio.gather(*runs, return_exceptions=True)

    watcher = _LostLeases()
    logging.getLogger("crashproof").addHandler(watcher)
    other = threading.Thread(target=another_worker, daemon=True)
    other.start()
    try:
        with cp.Ledger(url, lease_seconds=TTL) as ledger:
            results = asyncio.run(main(ledger))
    finally:
        logging.getLogger("crashproof").removeHandler(watcher)
        blocked.set()
        other.join(30)
    assert stolen == [], f"{len(stolen)} leases of a live process were taken: {stolen[:5]}"
    assert len(refused) == PROBED
    assert watcher.lost == [], f"{len(watcher.lost)} leases lost"
    failed = [r for r in results if r != 1]
    assert failed == [], f"{len(failed)} runs did not finish: {failed[:3]}"
