"""A child process for the approval/review SIGKILL tests: resume a run a human released
(an approval, a replan or an abort), die where told.

Usage: python approval_child.py DB BASE_URL RUN_ID N   (N: SIGKILL at the n-th crash point)
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.tools.http import HttpTool

POLICY = cp.Policy("ops-1", allow={"http": "*"}, risk={"http": "high"}, approval_required={"high"})


def make_workflow(tool: HttpTool) -> cp.Workflow[Any]:
    @cp.workflow("deploy", version="1")
    def flow(ctx: cp.Context) -> Any:
        ctx.step("plan", lambda: "plan")
        return ctx.act("create", tool, body={"name": "a"})["id"]

    return flow


def make_tool(base_url: str) -> HttpTool:
    return HttpTool(base_url, "/resources", lookup_path="/resources/by-key/{operation_id}")


def main(db: Path, base_url: str, run_id: str, n: int) -> None:
    points = cp.CrashPoints(at=n, action="sigkill")
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}", crash_points=points)
    ledger.register_policy(POLICY)
    with make_tool(base_url) as tool:
        ledger.register(make_workflow(tool))
        with contextlib.suppress(cp.RunFailed):  # an abort fails the run (if it gets there)
            ledger.resume(run_id)
    ledger.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]))
