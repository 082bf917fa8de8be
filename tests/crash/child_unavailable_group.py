"""A child process for tests/crash/test_sigkill_unavailable_group.py: a fan-out of
lookup-less acts, one run each (as an agent's parallel tool calls are: the LangGraph
integration runs each call as its own run), driven at once on one ledger: threads (sync)
or one loop (async, their commits batched). The effects are lines in DIR/posted.txt.

- run ``b`` posts at once and completes;
- run ``a`` waits for ``b`` to complete, then finds its target out (DIR/lock-a: out for
  run a) on every attempt: ``cp.Unavailable``, the run stops, resumable;
- run ``c`` waits in its execute, after its intent, until ``a`` has stopped, then posts;
- run ``d`` waits in a step until ``a`` has stopped, then posts what ``a`` posts: the
  same intent (a model that called one tool twice with the same arguments), which a
  holds against it while a's act is unresolved (steps/holds.py).

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

RUNS = ("a", "b", "c", "d")
TEXTS = {"a": "a", "b": "b", "c": "c", "d": "a"}  # d's act is a's intent
MODE = {"point": "none"}  # the parent's drive: "resumed" (nothing waits)
FAST = ActSettings(retryable_attempts=2, lookup_attempts=1, backoff=0.0)
_posting = threading.Lock()


def status(db: Path, run_id: str) -> str | None:
    """The run's status as committed (another connection: what a crash would leave)."""
    with sqlite3.connect(db, timeout=30) as conn:
        row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else str(row[0])


def wait(db: Path, run_id: str, until: str) -> None:
    """In the child: until the run's committed status is ``until``."""
    deadline = time.monotonic() + 60
    while MODE["point"] != "resumed" and status(db, run_id) != until:
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} never became {until}")
        time.sleep(0.01)


class Post(cp.Tool):
    """Appends ``OPERATION_ID TEXT``; out while ``DIR/lock-RUN`` exists; no lookup."""

    name: ClassVar[str] = "post"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(self, db: Path, directory: Path, on_unknown: str) -> None:
        self.db, self.directory = db, directory
        self.on_unknown = cp.OnUnknown(on_unknown)

    def execute(self, call: cp.Call) -> cp.Receipt:
        text = call.params["text"]
        if call.run_id == "a":
            wait(self.db, "b", "succeeded")
        if call.run_id == "c":
            wait(self.db, "a", "stopped")
            if MODE["point"] == "in-execute:c":
                os.kill(os.getpid(), signal.SIGKILL)
        if (self.directory / f"lock-{call.run_id}").exists():
            raise cp.Unavailable(f"{call.run_id}'s target is out; nothing was posted")
        with _posting, (self.directory / "posted.txt").open("a", encoding="utf-8") as out:
            out.write(f"{call.operation_id} {text}\n")
        return cp.Receipt(call.operation_id, {"posted": text})


def flows(tool: cp.Tool) -> tuple[cp.Workflow[Any], cp.Workflow[Any]]:
    db = getattr(tool, "db", Path("."))

    @cp.workflow("fan-out", version="1")
    def sync(ctx: cp.Context, name: str, text: str) -> Any:
        if name == "d":
            ctx.step("wait", lambda: wait(db, "a", "stopped"))
        try:
            return ctx.act(f"post-{name}", tool, text=text)
        except cp.ActNotDone:
            return {"not_done": text}

    @cp.workflow("fan-out", version="1")
    async def asynchronous(ctx: cp.AsyncContext, name: str, text: str) -> Any:
        if name == "d":
            await ctx.step("wait", lambda: wait(db, "a", "stopped"))
        try:
            return await ctx.act(f"post-{name}", tool, text=text)
        except cp.ActNotDone:
            return {"not_done": text}

    return sync, asynchronous


def drive_all(ledger: cp.Ledger, tool: cp.Tool, shell: str) -> dict[str, Any]:
    """Every run at once: started, or resumed where it exists; each one's result or error."""
    sync, asynchronous = flows(tool)
    if shell == "async":

        async def gather() -> list[Any]:
            runs = (ledger.run_async(asynchronous, run_id=r, name=r, text=TEXTS[r]) for r in RUNS)
            return await asyncio.gather(*runs, return_exceptions=True)

        return dict(zip(RUNS, asyncio.run(gather()), strict=True))
    got: dict[str, Any] = {}

    def one(run_id: str) -> None:
        try:
            got[run_id] = ledger.run(sync, run_id=run_id, name=run_id, text=TEXTS[run_id])
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
    MODE["point"] = point
    tool = Post(db, directory, on_unknown)
    with cp.Ledger(f"sqlite:///{db}", act_settings=FAST, crash_points=points) as ledger:
        got = drive_all(ledger, tool, shell)
    print({r: type(v).__name__ if isinstance(v, BaseException) else v for r, v in got.items()})


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
