"""A zygote for the approval crash matrix (``test_approvals.py``): it imports pydantic-ai
once, then for each line ``URL DIR MODE N`` read from stdin forks a child that resumes
the approved ``janitor`` run (``approval_agents``) in a sync or async workflow with a
SIGKILL at the N-th crash point, and writes back the child's wait status."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/: the package root

import crashproof as cp
from integrations.pydantic_ai.approval_agents import OPTIONS, POLICY, make_janitor
from integrations.pydantic_ai.pyd_agents import workflow


def resume(url: str, directory: Path, mode: str, points: cp.CrashPoints | None = None) -> object:
    """Drive run ``r`` once more (the approved call runs in this drive)."""
    with cp.Ledger(url, crash_points=points) as ledger:
        ledger.register_policy(POLICY)
        wf = workflow(ledger, make_janitor(directory), mode)
        if mode == "async":
            return asyncio.run(ledger.run_async(wf, run_id="r", prompt="go", options=OPTIONS))
        return ledger.run(wf, run_id="r", prompt="go", options=OPTIONS)


def forked(url: str, directory: str, mode: str, n: str) -> None:
    resume(url, Path(directory), mode, cp.CrashPoints(at=int(n), action="sigkill"))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/: the shared zygote
    from zygote import serve

    serve(forked)
