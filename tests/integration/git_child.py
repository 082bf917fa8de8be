"""The workflow of the git integration tests, and a child process that runs it.

Usage: python git_child.py DB REPO POINT [WORKFLOW]   (POINT: a crash point name to SIGKILL
at, or "none"; WORKFLOW: "git-flow", the default, or "git-hooked"). Exit status 0: the run
succeeded; 3: it stopped frozen (needs_review).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.tools.git import GitTool

RUN_ID = "run"


def _flow(ctx: cp.Context, repo: str) -> dict[str, Any]:
    ws = cp.Workspace(repo)
    git = GitTool(repo)
    ctx.act("write-a", ws, op="write", path="a.txt", content="alpha\n")
    ctx.act("append-b", ws, op="append", path="notes/b.txt", text="+line-1\n")
    commit = ctx.act(
        "commit", git, op="commit", message="Add a and b", paths=["a.txt", "notes/b.txt"]
    )
    branch = ctx.act("branch", git, op="branch", name="feature", start=commit["sha"])
    push = ctx.act("push", git, op="push", branch="feature")
    return {"commit": commit, "branch": branch, "push": push}


flow: cp.Workflow[dict[str, Any]] = cp.workflow("git-flow", version="1")(_flow)


def _hooked(ctx: cp.Context, repo: str) -> dict[str, Any]:
    """One file and its commit, by a GitTool that runs the repository's hooks."""
    ws = cp.Workspace(repo)
    git = GitTool(repo, hooks=True)
    ctx.act("write-a", ws, op="write", path="a.txt", content="alpha\n")
    commit: dict[str, Any] = ctx.act("commit", git, op="commit", message="Add a", paths=["a.txt"])
    return commit


hooked: cp.Workflow[dict[str, Any]] = cp.workflow("git-hooked", version="1")(_hooked)
WORKFLOWS = {"git-flow": flow, "git-hooked": hooked}


def main(db: Path, repo: Path, point: str, workflow: str = "git-flow") -> int:
    points = None if point == "none" else cp.CrashPoints(match=point, action="sigkill")
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}", crash_points=points)
    try:
        ledger.run(WORKFLOWS[workflow], run_id=RUN_ID, repo=str(repo.resolve()))
    except cp.RunFrozen:
        return 3
    finally:
        ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]))
