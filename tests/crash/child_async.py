"""A child process for the async crash test: an async workflow with awaited decisions,
a plain step (run in a thread), an act on an async tool and one on a sync ``Workspace``.

Usage: python child_async.py URL DURABILITY DIR SPEC   (SPEC: none | at:N)
Every body execution appends its key to DIR/counts, and the async tool's target keeps
its effects in DIR/target.json, so both survive SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp


class Notes(cp.Tool):
    """An async target that dedupes by operation id: one note per key, with its digest."""

    name: ClassVar[str] = "notes"
    version: ClassVar[str] = "1"

    def __init__(self, path: Path) -> None:
        self.path = path

    def _state(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}  # type: ignore[no-any-return]

    async def execute(self, call: cp.Call) -> cp.Receipt:
        await asyncio.sleep(0)
        state = self._state()
        note = state.setdefault(call.operation_id, {"digest": call.intent_digest, "n": 0})
        note["n"] += 1  # how often the target was asked: deduped, but counted
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps(state))
        temp.replace(self.path)
        call.crash_point("written")
        return cp.Receipt(call.operation_id, {"text": call.params["text"]}, note["digest"])

    async def lookup(self, call: cp.Call) -> cp.Receipt | None:
        await asyncio.sleep(0)
        note = self._state().get(call.operation_id)
        if note is None:
            return None
        return cp.Receipt(call.operation_id, {"text": call.params["text"]}, note["digest"])


def make(directory: Path) -> cp.Workflow[Any]:
    counts = directory / "counts"
    notes = Notes(directory / "target.json")
    workspace = cp.Workspace(directory / "ws")

    def note(key: str) -> None:
        with counts.open("a", encoding="utf-8") as f:
            f.write(key + "\n")

    async def plan(files: int) -> cp.Decision:
        note("plan")
        await asyncio.sleep(0)
        edits = [f"f{i}.txt" for i in range(files)]
        return cp.Decision(edits, model="m", usage={"total_tokens": 5}, cost=0.1)

    def size(name: str) -> int:  # a plain function: a worker thread
        note(f"size:{name}")
        return len(name)

    async def review(total: int) -> cp.Decision:
        note("review")
        return cp.Decision(f"ok {total}", model="m", usage={"total_tokens": 7}, cost=0.2)

    @cp.workflow("async-crash", version="1")
    async def flow(ctx: cp.AsyncContext, files: int) -> dict[str, Any]:
        edits = await ctx.decide("plan", plan, files)
        total = 0
        for name in edits:
            await ctx.act(f"write:{name}", workspace, op="write", path=name, content=name)
            total += await ctx.step(f"size:{name}", size, name)
        posted = await ctx.act("post", notes, text=f"{total} bytes")
        verdict = await ctx.decide("review", review, total)
        return {"edits": edits, "total": total, "posted": posted, "verdict": verdict}

    return flow


def main(url: str, durability: str, directory: Path, spec: str) -> None:
    points = cp.CrashPoints(at=int(spec[3:]), action="sigkill") if spec != "none" else None
    (directory / "ws").mkdir(exist_ok=True)
    with cp.Ledger(url, durability=durability, crash_points=points) as ledger:
        asyncio.run(ledger.run_async(make(directory), run_id="a", files=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4])
