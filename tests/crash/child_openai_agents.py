"""A zygote for the OpenAI Agents SDK crash matrix (as ``child_pydantic_ai.py``): it
imports the SDK once, then for each line ``URL DIR MODEL_URL N`` forks a child that runs
the agent of ``tests/integrations/openai_agents/test_runner.py`` with a SIGKILL at the
N-th crash point, and writes back the child's wait status."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
from tests.integrations.openai_agents import test_runner as oa

import crashproof as cp


def child(url: str, directory: Path, model_url: str, n: int) -> None:
    points = cp.CrashPoints(at=n, action="sigkill")
    model_url, _, note = model_url.partition("|")  # "URL|at_least_once": the note's meaning
    with cp.Ledger(url, crash_points=points) as ledger:
        wf = oa.workflow(ledger, oa.make(directory, model_url, note or "review"), "async")
        asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))


def forked(url: str, directory: str, model_url: str, n: str) -> None:
    child(url, Path(directory), model_url, int(n))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared zygote
    from zygote import serve

    serve(forked)
