"""SIGKILL of a real child at every crash point of an agent whose tools come from a
real stdio MCP server, both tools marked ``EFFECT`` (acts without lookup): killed in a
sync or an async workflow (alternately), resumed in the other kind in this process.
Every point ends SAME (the uninterrupted answer, ``bump``'s effect once) or REFUSED
(an intent without a receipt: needs_review, the effect never run twice); once every
MCP step is recorded, the resumed run never starts the server."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import crashproof as cp
import zygote as zygotes

from .mcp_agents import lines, make_agent
from .pyd_agents import drive, workflow

CHILD = Path(__file__).parent / "mcp_child.py"
ANSWER = "done with bump,double"
BUMP, DOUBLE = "counter:model_request/0:bump", "counter:model_request/1:double"
# An intent committed and its receipt not: the run waits for review.
REFUSED = {
    f"after_commit[act_intent:{BUMP}]",
    f"before_commit[step_done:{BUMP}]",
    f"after_commit[act_intent:{DOUBLE}]",
    f"before_commit[step_done:{DOUBLE}]",
}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def zygote() -> Iterator[subprocess.Popen[str]]:
    yield from zygotes.started(CHILD)


def _points(directory: Path) -> list[str]:
    points = cp.CrashPoints()
    with cp.Ledger("memory://", crash_points=points) as ledger:
        wf = workflow(ledger, make_agent(directory, effect=True), "sync")
        assert drive(ledger, wf, "sync", prompt="go") == ANSWER
    return points.passed


def test_sigkill_at_every_point_of_an_mcp_agent(
    zygote: subprocess.Popen[str], tmp_path: Path
) -> None:
    (tmp_path / "reference").mkdir()
    points = _points(tmp_path / "reference")
    assert "before_commit[step_done:counter:mcp/counter:list_tools]" in points
    recorded_from = points.index(f"after_commit[step_done:{DOUBLE}]")
    outcomes: Counter[str] = Counter()
    for n, point in enumerate(points, start=1):
        mode, other = ("sync", "async") if n % 2 else ("async", "sync")
        directory = tmp_path / str(n)
        directory.mkdir()
        url = f"sqlite:///{directory}/runs.db"
        assert zygotes.kill(zygote, url, directory, mode, n) == -signal.SIGKILL, point
        starts = lines(directory / "server.log").count("start")
        with cp.Ledger(url) as ledger:  # the next process
            wf = workflow(ledger, make_agent(directory, effect=True), other)
            status, outcome = "succeeded", "SAME"
            try:
                assert drive(ledger, wf, other, prompt="go") == ANSWER, point
            except cp.RunFrozen as frozen:
                status, outcome = frozen.status, "REFUSED"
        assert status == ("needs_review" if outcome == "REFUSED" else "succeeded"), point
        assert (outcome == "REFUSED") == (point in REFUSED), point
        effects = lines(directory / "effects")
        # bump's effect: never twice; absent only when killed after its intent, before it
        assert effects == ([] if point == f"after_commit[act_intent:{BUMP}]" else ["3"]), point
        log = lines(directory / "server.log")
        assert log.count("call:bump") == len(effects), (point, log)
        assert log.count("call:double") <= 1, (point, log)
        if n - 1 >= recorded_from:  # every MCP step recorded: the server is not started
            assert log.count("start") == starts == 1, (point, log)
        outcomes[outcome] += 1
    assert outcomes["REFUSED"] == len(REFUSED)
    assert outcomes["SAME"] == len(points) - len(REFUSED)
