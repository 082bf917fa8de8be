"""A zygote for the pydantic-ai crash matrix: it imports pydantic-ai once (seconds on a
loaded machine), then for each line ``URL DIR MODE N`` read from stdin forks a child
that runs the agent of ``pyd_agents.make_agent`` (sync or async workflow; ``MODE`` may
say the note's ``cp.OnUnknown`` too: ``sync/at_least_once``) with a SIGKILL at the N-th
crash point, and writes back the child's wait status. Each child is
a real process killed by SIGKILL mid-run; the zygote itself runs nothing."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "integrations" / "pydantic_ai"))
import pyd_agents

import crashproof as cp


def child(url: str, directory: Path, mode: str, n: int) -> None:
    points = cp.CrashPoints(at=n, action="sigkill")
    mode, _, note = mode.partition("/")
    with cp.Ledger(url, crash_points=points) as ledger:
        agent = pyd_agents.make_agent(directory, note=note or "review")
        wf = pyd_agents.workflow(ledger, agent, mode)
        pyd_agents.drive(ledger, wf, mode, prompt="go")


def forked(url: str, directory: str, mode: str, n: str) -> None:
    child(url, Path(directory), mode, int(n))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared zygote
    from zygote import serve

    serve(forked)
