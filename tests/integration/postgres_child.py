"""Child process for the PostgreSQL crash tests: a workflow with steps, decisions and a
workspace act on a PostgreSQL ledger, killed by SIGKILL at a named crash point.

Usage: python postgres_child.py URL COUNTS WORKSPACE CRASH_POINT|none
Every body execution appends its name to COUNTS, so the counts survive SIGKILL.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import crashproof as cp


def make(counts: Path, ws: cp.Workspace) -> cp.Workflow[Any]:
    def note(name: str) -> None:
        with counts.open("a", encoding="utf-8") as f:
            f.write(name + "\n")

    def fetch(repo: str) -> dict[str, Any]:
        note("fetch")
        return {"repo": repo, "files": ["a.py", "b.py"]}

    def plan(state: dict[str, Any]) -> cp.Decision:
        note("plan")
        edits = [f"edit {f}" for f in state["files"]]
        return cp.Decision(edits, model="m", usage={"total_tokens": 5}, cost=0.1)

    def apply(edits: list[str], receipt: dict[str, Any]) -> int:
        note("apply")
        return len(edits) + len(receipt["path"])

    def review(count: int) -> cp.Decision:
        note("review")
        return cp.Decision(f"approved {count}", model="m", usage={"total_tokens": 7}, cost=0.2)

    @cp.workflow("pg-crash", version="1")
    def workflow(ctx: cp.Context, repo: str) -> dict[str, Any]:
        state = ctx.step("fetch", fetch, repo)
        edits = ctx.decide("plan", plan, state)
        receipt = ctx.act("write", ws, op="append", path="notes.txt", text="+" + edits[0] + "\n")
        count = ctx.step("apply", apply, edits, receipt)
        verdict = ctx.decide("review", review, count)
        return {"edits": edits, "receipt": receipt, "verdict": verdict}

    return workflow


def main(url: str, counts: Path, root: Path, point: str) -> None:
    points = None if point == "none" else cp.CrashPoints(match=point, action="sigkill")
    ledger = cp.Ledger(url, crash_points=points)
    ledger.run(make(counts, cp.Workspace(root)), run_id="r", repo="x")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
