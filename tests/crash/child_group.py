"""A child process for the group-commit crash test: RUNS async runs on one loop, each
with ACTS acts on a deduping target, whose output points share forced syncs; the child
SIGKILLs itself at the K-th grouped sync.

Usage: python child_group.py URL DIR SPEC
SPEC: none | sync:K:WHERE (SQLite, ``output`` durability: WHERE is ``before`` the WAL's
fdatasync, ``synced`` after it and before the witness write, ``witnessed`` after that and
before any of the runs goes on) | batch:K:WHERE (PostgreSQL: the K-th commit of several
runs' records in one transaction, WHERE ``before`` or ``after`` it). The target keeps its
effects in DIR/target.json; DIR/covered gets the runs the fatal sync covered.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parent))
from child_async import Notes

RUNS, ACTS = 8, 3


class Slow(Notes):
    """``Notes`` whose receipt comes a little after its effect: a kill at another run's
    sync can fall between the two (an unknown outcome, to be looked up)."""

    async def execute(self, call: cp.Call) -> cp.Receipt:
        receipt = await super().execute(call)
        await asyncio.sleep(0.003)
        return receipt


def make(directory: Path) -> cp.Workflow[Any]:
    notes = Slow(directory / "target.json")

    async def plan(n: int) -> cp.Decision:
        await asyncio.sleep(0)
        return cp.Decision([f"n{n}-{k}" for k in range(ACTS)], model="m")

    async def think(n: int, k: int) -> int:
        await asyncio.sleep((n * 7 + k * 3) % 5 / 1000)  # the runs drift apart
        return k

    @cp.workflow("group-crash", version="1")
    async def flow(ctx: cp.AsyncContext, n: int) -> list[Any]:
        texts = await ctx.decide("plan", plan, n)
        posted = []
        for k, text in enumerate(texts):
            await ctx.step(f"think{k}", think, n, k)
            posted.append(await ctx.act(f"post{k}", notes, text=text))
        return posted

    return flow


async def drive_all(ledger: cp.Ledger, flow: cp.Workflow[Any]) -> list[Any]:
    """Every run at once on this loop: started, or resumed when it exists already."""
    return await asyncio.gather(*(ledger.run_async(flow, run_id=f"r{n}", n=n) for n in range(RUNS)))


def _die(directory: Path, covered: object) -> None:
    (directory / "covered").write_text(repr(covered))
    os.kill(os.getpid(), signal.SIGKILL)


def arm(ledger: cp.Ledger, directory: Path, spec: str) -> None:
    """Kill this process at the K-th grouped sync (SQLite) or batch commit (PostgreSQL)."""
    kind, at, where = spec.split(":")
    store: Any = ledger._store
    seen = [0]
    if kind == "sync":  # SQLite: the store's group sync
        if where == "before":  # its listeners run right before the fdatasync

            def before(_path: Path) -> None:
                seen[0] += 1
                if seen[0] == int(at):
                    _die(directory, "before the fdatasync")

            store.on_sync.append(before)
            return
        advance = store.on_durable  # the leader's witness write, right after the sync

        def durable(notes: dict[str, int]) -> None:
            seen[0] += 1
            fatal = seen[0] == int(at)
            if fatal and where == "synced":
                _die(directory, sorted(notes))
            advance(notes)
            if fatal:
                _die(directory, sorted(notes))

        store.on_durable = durable
        return
    append_batch = store.append_batch  # PostgreSQL: one transaction for several runs

    def batch(groups: Any) -> Any:
        if len(groups) > 1:
            seen[0] += 1
        fatal = seen[0] == int(at) and len(groups) > 1
        if fatal and where == "before":
            _die(directory, len(groups))
        kept = append_batch(groups)
        if fatal:
            _die(directory, len(groups))
        return kept

    store.append_batch = batch


def main(url: str, directory: Path, spec: str) -> None:
    with cp.Ledger(url, durability="output") as ledger:
        if spec != "none":
            arm(ledger, directory, spec)
        asyncio.run(drive_all(ledger, make(directory)))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
