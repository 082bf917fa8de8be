"""The app module of the worker-process tests (``crashproof worker --app worker_app``).

Configured by environment variables, read at import:

- ``WORKER_LINES``: the file ``LineTool`` appends to. Its execute appends one line per
  call and never dedupes, so a duplicated effect shows as a repeated line; its lookup
  reads the file (the effect is visible, but only recovery looks).
- ``WORKER_MARKS``: a directory where each pause point drops ``<point>.<run>.<pid>`` when
  it is reached, before it pauses.
- ``WORKER_PAUSE``: seconds the pause points of this process wait (default 0).
- ``WORKER_HTTP``: the base URL of a fencing-enforcing test server (tests/integration/
  http_server.py) for the ``posting`` workflow.

``python worker_app.py crash URL RUN_ID N POINT`` starts the ``lines`` run RUN_ID with N
lines and SIGKILLs this process at crash point POINT (lease 1 s).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp

LINES = Path(os.environ.get("WORKER_LINES", "lines.txt"))
MARKS = Path(os.environ.get("WORKER_MARKS", "."))
PAUSE = float(os.environ.get("WORKER_PAUSE", "0"))


def pause_point(point: str, run_id: str) -> None:
    """Mark that this process reached ``point`` of ``run_id``, then pause (if asked)."""
    (MARKS / f"{point}.{run_id}.{os.getpid()}").write_text(str(time.time()))
    if PAUSE:
        time.sleep(PAUSE)


class LineTool(cp.Tool):
    """Appends ``text`` and the operation id as one line; no dedupe of its own."""

    name: ClassVar[str] = "lines"
    version: ClassVar[str] = "1"

    def execute(self, call: cp.Call) -> cp.Receipt:
        line = f"{call.operation_id} {call.params['text']} token={call.fencing_token}"
        with LINES.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        return cp.Receipt(call.operation_id, {"line": call.params["text"]}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if not LINES.exists():
            return None
        for line in LINES.read_text(encoding="utf-8").splitlines():
            if line.split(" ", 1)[0] == call.operation_id:
                return cp.Receipt(
                    call.operation_id, {"line": call.params["text"]}, call.intent_digest
                )
        return None


lines_tool = LineTool()


@cp.workflow("lines")
def lines(ctx: cp.Context, n: int, think: float = 0.0) -> int:
    """n rounds of: think (a local step), then append a line (an act)."""
    for i in range(n):

        def think_step(i: int = i) -> int:
            if i == 1:
                pause_point("think", ctx.run_id)
            time.sleep(think)
            return i

        ctx.step("think", think_step)
        ctx.act("line", lines_tool, text=f"{ctx.run_id}:{i}")
    return n


class PausingHttp(cp.Tool):
    """The HttpTool, with a pause point between the journaled intent and the request."""

    name: ClassVar[str] = "http"
    version: ClassVar[str] = "1"

    def __init__(self, base_url: str) -> None:
        from crashproof.tools.http import HttpTool

        self.http = HttpTool(base_url, "/resources", lookup_path="/resources/by-key/{operation_id}")

    def execute(self, call: cp.Call) -> cp.Receipt:
        pause_point("post", call.run_id)
        return self.http.execute(call)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        return self.http.lookup(call)


http_tool = PausingHttp(os.environ["WORKER_HTTP"]) if os.environ.get("WORKER_HTTP") else None


@cp.workflow("posting")
def posting(ctx: cp.Context, size: str) -> Any:
    """One HTTP create, then one line."""
    if http_tool is None:
        raise RuntimeError("set WORKER_HTTP to the fencing test server's URL")
    created = ctx.act("post", http_tool, body={"size": size})
    ctx.act("line", lines_tool, text=f"{ctx.run_id}:after-post")
    return created


def crash(url: str, run_id: str, n: int, point: str) -> None:
    ledger = cp.Ledger(
        url, lease_seconds=1.0, crash_points=cp.CrashPoints(match=point, action="sigkill")
    )
    ledger.run(lines, run_id=run_id, n=n)


if __name__ == "__main__":
    if sys.argv[1:2] != ["crash"]:
        raise SystemExit("usage: worker_app.py crash URL RUN_ID N POINT")
    crash(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
