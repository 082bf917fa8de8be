"""A zygote for the MCP crash matrix (as ``tests/crash/child_pydantic_ai.py``): it
imports pydantic-ai once, then for each line ``URL DIR MODE N`` read from stdin forks a
child that runs ``mcp_agents.make_agent(effect=True)`` (sync or async workflow) with a
SIGKILL at the N-th crash point, and writes back the child's wait status. The child's
MCP server (a stdio grandchild) sees its stdin closed and exits."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import mcp_agents
import pyd_agents

import crashproof as cp


def child(url: str, directory: Path, mode: str, n: int) -> None:
    points = cp.CrashPoints(at=n, action="sigkill")
    with cp.Ledger(url, crash_points=points) as ledger:
        wf = pyd_agents.workflow(ledger, mcp_agents.make_agent(directory, effect=True), mode)
        pyd_agents.drive(ledger, wf, mode, prompt="go")


def forked(url: str, directory: str, mode: str, n: str) -> None:
    child(url, Path(directory), mode, int(n))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/: the shared zygote
    from zygote import serve

    serve(forked)
