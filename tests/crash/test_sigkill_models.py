"""SIGKILL of a real child at the crash points of a small code agent on the ``openai``
SDK (``child_models.py``: a workspace write and a PR as acts, a check as a step, three
model turns), resumed by a new process: the same fingerprint as the uninterrupted run,
one PR, and no recorded decision asked again (the model server, in this process,
counts every request per turn). Output durability on SQLite only: the other modes and
stores are the runtime's, proven by the other matrices; this one proves the recorder.

Each child is forked from a ``multiprocessing`` forkserver that imported ``openai`` and
crashproof once: a fresh interpreter per point spent about 3 s of a loaded 2-core machine
importing the SDK (69 s for the 23 points). Forked, it is the same kind of process killed
the same way (SIGKILL at the point, its files left as they are), started in milliseconds.
All 23 points still take 47 s under a load of 7 (the resumes), so CI kills at a fixed
subset, ``POINTS`` (20 s there): every kind of commit (the run's start and end, a
decision, a step, an act's intent, its receipt), a decision's and an intent's from both
sides, and both effects left without a receipt. ``CRASHPROOF_FULL_MATRIX=1`` kills at
every point."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
import child_models
from model_server import ModelServer, Turn

# A single-threaded server process that imports the SDK once and forks each child.
FORKS = multiprocessing.get_context("forkserver")
# "__main__" too: else each child imports the main module (pytest) again.
FORKS.set_forkserver_preload(["__main__", "openai", "crashproof", "child_models"])
SCRIPT = [
    Turn(
        "edit",
        (
            ("write_file", '{"op": "write", "path": "fix.py", "content": "x = 1\\n"}'),
            ("check", '{"path": "fix.py"}'),
        ),
    ),
    Turn("pr", (("open_pr", '{"title": "fix the bug", "branch": "fix"}'),)),
    Turn("done"),
]
# The subset CI kills at, by kind (each is checked to be a point of the reference).
POINTS = (
    "after_commit[run_started]",  # nothing recorded but the start
    "before_commit[step_done:chat]",  # a decision lost: asked again, once
    "after_commit[step_done:chat#2]",  # a decision recorded: never asked again
    "after_commit[step_done:chat/1:check]",  # a function tool's step recorded
    "inside[act:chat/0:write_file:renamed]",  # the file written, no receipt
    "before_commit[act_intent:chat.2/0:open_pr]",  # no intent: executed afresh
    "after_commit[act_intent:chat.2/0:open_pr]",  # an intent, no effect: lookup, then once
    "inside[act:chat.2/0:open_pr:opened]",  # the PR opened, no receipt: found by lookup
    "before_commit[step_done:chat.2/0:open_pr]",  # the receipt lost: found by lookup
    "before_commit[run_succeeded]",  # the last decision replayed, the end lost
)


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer(SCRIPT, by_turn=True) as s:
        yield s


def _turns(requests: list[dict[str, Any]]) -> Counter[int]:
    return Counter(
        sum(1 for m in r["body"]["messages"] if m.get("role") == "assistant") for r in requests
    )


@pytest.fixture(scope="module")
def reference(server: ModelServer) -> tuple[Any, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        points = cp.CrashPoints()
        with cp.Ledger("memory://", crash_points=points) as ledger:
            result = ledger.run(child_models.make(ledger, root, server.url), run_id="a")
    assert _turns(server.requests) == {0: 1, 1: 1, 2: 1}
    return result, points.passed


def test_the_reference_passes_the_recorders_points(reference: tuple[Any, list[str]]) -> None:
    _, points = reference
    assert "before_commit[step_done:chat]" in points
    assert "inside[act:chat.2/0:open_pr:opened]" in points
    assert any(p.startswith("inside[act:chat/0:write_file") for p in points)


def test_sigkill_at_every_point_of_the_agent(
    server: ModelServer, reference: tuple[Any, list[str]], tmp_path: Path
) -> None:
    expected, points = reference
    assert set(POINTS) <= set(points)
    every = os.environ.get("CRASHPROOF_FULL_MATRIX") == "1"
    for n, point in enumerate(points, start=1):
        if not every and point not in POINTS:
            continue
        directory = tmp_path / str(n)
        (directory / "ws").mkdir(parents=True)
        url = f"sqlite:///{directory}/runs.db"
        del server.requests[:]
        child = FORKS.Process(
            target=child_models.main, args=(url, str(directory), server.url, f"at:{n}")
        )
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL, point
        with cp.Ledger(url) as ledger:
            got = ledger.run(child_models.make(ledger, directory, server.url), run_id="a")
        assert got == expected, point
        prs = json.loads((directory / "prs.json").read_text())
        assert list(prs) == ["a/chat.2/0:open_pr"], point  # one PR, under its operation id
        asked = _turns(server.requests)
        # A turn is asked twice only when the crash lost its answer before the commit.
        again = {t for t, c in asked.items() if c > 1}
        assert all(asked[t] <= 2 for t in asked), (point, asked)
        lost = {
            "before_commit[step_done:chat]": 0,
            "before_commit[step_done:chat#2]": 1,
            "before_commit[step_done:chat#3]": 2,
        }
        assert again <= ({lost[point]} if point in lost else set()), (point, asked)
