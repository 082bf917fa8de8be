"""A child process for the power-cut trials on a real filesystem image: wave after wave
of concurrent async runs in ``output`` durability, until it is killed.

Usage: python child_powercut.py LEDGER_DB OUTSIDE RUNS   (CRASHPROOF_KEY set)

Each run makes two model decisions and three acts on ``Notes``, whose target lives in
OUTSIDE (off the image: the world a power cut of the machine does not roll back). What
leaves the process is appended to files there, one ``write`` each (O_APPEND):
``asked`` (a run about to be started), ``effects`` (an act executed: ``run_id step
operation_id intent_digest``) and ``done`` (a run's result handed back to its caller).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp


def append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Notes(cp.Tool):
    """A target that never dedupes by itself: every execute is one more line, so a
    duplicated effect shows. Its lookup finds an effect by operation id."""

    name: ClassVar[str] = "notes"
    version: ClassVar[str] = "1"

    def __init__(self, outside: Path) -> None:
        self.effects = outside / "effects"

    async def execute(self, call: cp.Call) -> cp.Receipt:
        append(self.effects, f"{call.run_id} {call.step} {call.operation_id} {call.intent_digest}")
        return cp.Receipt(call.operation_id, {"ok": call.params["text"]}, call.intent_digest)

    async def lookup(self, call: cp.Call) -> cp.Receipt | None:
        await asyncio.sleep(0)
        if not self.effects.exists():
            return None
        for line in self.effects.read_text().splitlines():
            _run, _step, operation_id, digest = line.split()
            if operation_id == call.operation_id:
                return cp.Receipt(call.operation_id, {"ok": call.params["text"]}, digest)
        return None


def make(outside: Path) -> cp.Workflow[Any]:
    notes = Notes(outside)

    async def think(i: int) -> cp.Decision:
        await asyncio.sleep(0.01)
        return cp.Decision({"i": i}, model="m", usage={"total_tokens": 3})

    @cp.workflow("powercut-image", version="1")
    async def flow(ctx: cp.AsyncContext, n: int) -> int:
        total = 0
        for i in range(3):
            got = await ctx.decide(f"think:{i}", think, i)
            await ctx.act(f"note:{i}", notes, text=f"{ctx.run_id}:{i}")
            total += got["i"] + n
        return total

    return flow


EXPECTED = {n: sum(range(3)) + 3 * n for n in range(1000)}  # flow's result for input n


async def waves(ledger: cp.Ledger, flow: cp.Workflow[Any], outside: Path, runs: int) -> None:
    async def one(run_id: str, n: int) -> None:
        append(outside / "asked", f"{run_id} {n}")
        result = await ledger.run_async(flow, run_id=run_id, n=n)
        append(outside / "done", f"{run_id} {result}")

    wave = 0
    while True:
        await asyncio.gather(*(one(f"w{wave}r{k}", k) for k in range(runs)))
        wave += 1


def main() -> None:
    database, outside, runs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    flow = make(outside)
    with cp.Ledger(f"sqlite:///{database}") as ledger:  # "output" durability: the default
        asyncio.run(waves(ledger, flow, outside, runs))


if __name__ == "__main__":
    main()
