"""A child process for the HttpTool crash tests: run the workflow, die where told.

Usage: python http_child.py DB BASE_URL RUN_ID CRASH_POINT   (CRASH_POINT: none | a name)
The server runs in the parent (pytest) process; this process talks to it over loopback
and is SIGKILLed by its own armed crash point.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.tools.http import HttpTool

WORKFLOW = "http-create"


def make_tool(base_url: str, *, timeout: float = 5.0) -> HttpTool:
    return HttpTool(
        base_url,
        "/resources",
        lookup_path="/resources/by-key/{operation_id}",
        timeout=timeout,
    )


def make_workflow(tool: HttpTool) -> cp.Workflow[Any]:
    """Two creates: operation ids ``RUN/create`` and ``RUN/create#2``."""

    @cp.workflow(WORKFLOW, version="1")
    def create_two(ctx: cp.Context, names: list[str]) -> dict[str, Any]:
        first = ctx.act("create", tool, body={"name": names[0]})
        second = ctx.act("create", tool, body={"name": names[1]})
        return {"ids": [first["id"], second["id"]], "bodies": [first["body"], second["body"]]}

    return create_two


def main(db: Path, base_url: str, run_id: str, point: str) -> None:
    points = None if point == "none" else cp.CrashPoints(match=point, action="sigkill")
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}", crash_points=points)
    with make_tool(base_url) as tool:
        ledger.run(make_workflow(tool), run_id=run_id, names=["a", "b"])
    ledger.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
