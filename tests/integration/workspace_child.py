"""Child process: the seed's 8-step task through a Workspace, dying at a crash point.

Usage: python workspace_child.py DB WORKSPACE CRASH_POINT_NAME|none
"""

from __future__ import annotations

import sys
from pathlib import Path

import crashproof as cp


def make(ws: cp.Workspace) -> cp.Workflow[str]:
    @cp.workflow("seed-patch", version="1")
    def seed_patch(ctx: cp.Context) -> str:
        for k in range(8):
            ctx.act(f"s{k}", ws, op="append", path="notes.txt", text=f"+line-{k}\n")
        return ws.fingerprint()

    return seed_patch


def main(db: Path, root: Path, point: str) -> None:
    points = None if point == "none" else cp.CrashPoints(match=point, action="sigkill")
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}", crash_points=points)
    ledger.run(make(cp.Workspace(root)), run_id="seed")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
