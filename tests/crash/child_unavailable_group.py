"""A child process for tests/crash/test_sigkill_unavailable_group.py: a fan-out of
lookup-less acts, one run each (as an agent's parallel tool calls are: the LangGraph
integration runs each call as its own run), driven at once on one ledger: threads (sync)
or one loop (async, their commits batched). The effects are lines in DIR/posted.txt.

- run ``b`` posts at once and completes;
- run ``a`` waits for ``b`` to complete, then finds its target out (DIR/lock-a) on every
  attempt: ``cp.Unavailable``, the run stops, resumable;
- run ``c`` waits in its execute, after its intent, until ``a`` has stopped, then posts.

Usage: python child_unavailable_group.py DB DIR SHELL POINT ON_UNKNOWN, POINT one of
``none``, a crash point's name (the child SIGKILLs itself there, ``cp.CrashPoints(action=
"sigkill")``), or ``in-execute:c`` (run c's execute kills the child before it posts);
ON_UNKNOWN the tool's ``cp.OnUnknown``. A run whose act is recorded not done
(``at_most_once``) returns ``{"not_done": TEXT}``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp
from crashproof.runtime.port import ActSettings

RUNS = ("a", "b", "c")
FAST = ActSettings(retryable_attempts=2, lookup_attempts=1, backoff=0.0)
_posting = threading.Lock()


def status(db: Path, run_id: str) -> str | None:
    """The run's status as committed (another connection: what a crash would leave)."""
    with sqlite3.connect(db, timeout=30) as conn:
        row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else str(row[0])


class Post(cp.Tool):
    """Appends ``OPERATION_ID TEXT``; out while ``DIR/lock-TEXT`` exists; no lookup."""

    name: ClassVar[str] = "post"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(self, db: Path, directory: Path, point: str, on_unknown: str) -> None:
        self.db, self.directory, self.point = db, directory, point
        self.on_unknown = cp.OnUnknown(on_unknown)

    def _wait(self, run_id: str, until: str) -> None:
        deadline = time.monotonic() + 60
        while status(self.db, run_id) != until:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} never became {until}")
            time.sleep(0.01)

    def execute(self, call: cp.Call) -> cp.Receipt:
        text = call.params["text"]
        if self.point != "resumed":
            if text == "a":
                self._wait("b", "succeeded")
            if text == "c":
                self._wait("a", "stopped")
                if self.point == "in-execute:c":
                    os.kill(os.getpid(), signal.SIGKILL)
        if (self.directory / f"lock-{text}").exists():
            raise cp.Unavailable(f"{text}'s target is out; nothing was posted")
        with _posting, (self.directory / "posted.txt").open("a", encoding="utf-8") as out:
            out.write(f"{call.operation_id} {text}\n")
        return cp.Receipt(call.operation_id, {"posted": text})


def flows(tool: cp.Tool) -> tuple[cp.Workflow[Any], cp.Workflow[Any]]:
    @cp.workflow("fan-out", version="1")
    def sync(ctx: cp.Context, text: str) -> Any:
        try:
            return ctx.act(f"post-{text}", tool, text=text)
        except cp.ActNotDone:
            return {"not_done": text}

    @cp.workflow("fan-out", version="1")
    async def asynchronous(ctx: cp.AsyncContext, text: str) -> Any:
        try:
            return await ctx.act(f"post-{text}", tool, text=text)
        except cp.ActNotDone:
            return {"not_done": text}

    return sync, asynchronous


def drive_all(ledger: cp.Ledger, tool: cp.Tool, shell: str) -> dict[str, Any]:
    """Every run at once: started, or resumed where it exists; each one's result or error."""
    sync, asynchronous = flows(tool)
    if shell == "async":

        async def gather() -> list[Any]:
            runs = (ledger.run_async(asynchronous, run_id=r, text=r) for r in RUNS)
            return await asyncio.gather(*runs, return_exceptions=True)

        return dict(zip(RUNS, asyncio.run(gather()), strict=True))
    got: dict[str, Any] = {}

    def one(run_id: str) -> None:
        try:
            got[run_id] = ledger.run(sync, run_id=run_id, text=run_id)
        except Exception as exc:
            got[run_id] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in RUNS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return got


def main(db: Path, directory: Path, shell: str, point: str, on_unknown: str) -> None:
    (directory / "lock-a").touch()
    points = None
    if point not in ("none", "in-execute:c"):
        points = cp.CrashPoints(match=point, action="sigkill")
    tool = Post(db, directory, point, on_unknown)
    with cp.Ledger(f"sqlite:///{db}", act_settings=FAST, crash_points=points) as ledger:
        got = drive_all(ledger, tool, shell)
    print({r: type(v).__name__ if isinstance(v, BaseException) else v for r, v in got.items()})


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
