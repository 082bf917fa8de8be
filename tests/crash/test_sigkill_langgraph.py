"""SIGKILL of a real child running a LangGraph agent on CrashproofSaver, at every crash
point of its model and tool calls (NodeCalls), resumed by a new process: the tool's
effect happens once at the HTTP target, no recorded model call is asked again, and the
graph ends with the state of an uninterrupted run."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
import child_langgraph
from http_server import IdempotentServer

from crashproof.cli import main
from crashproof.integrations.langgraph import CrashproofSaver

CHILD = Path(__file__).parent / "child_langgraph.py"
pytestmark = pytest.mark.timeout(120)


def _reference(tmp: Path) -> tuple[list[list[str]], list[str]]:
    points = cp.CrashPoints()
    with IdempotentServer(tmp / "target.json") as server:
        ledger = cp.Ledger(f"sqlite:///{tmp / 'ref.db'}", crash_points=points)
        with CrashproofSaver(ledger=ledger) as saver:
            final = child_langgraph.drive(child_langgraph.build(saver, tmp, server.url))
        ledger.close()
    return final, points.passed


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[str]], list[str]]:
    return _reference(tmp_path_factory.mktemp("reference"))


def test_the_reference_passes_the_tool_window(reference: tuple[list[list[str]], list[str]]) -> None:
    final, points = reference
    assert [kind for kind, _ in final] == ["human", "ai", "tool", "ai"]
    assert "inside[act:call:responded]" in points  # the effect made, no receipt yet
    assert 15 <= len(points) <= 60  # bounds the matrix below


class _Children:
    """Child processes forked by one that imported LangGraph once (``serve``)."""

    def __init__(self) -> None:
        self._server = subprocess.Popen(
            [sys.executable, str(CHILD), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, url: str, directory: Path, target: str, spec: str) -> int:
        """One child's exit code (-9: killed by SIGKILL)."""
        assert self._server.stdin is not None
        assert self._server.stdout is not None
        self._server.stdin.write(json.dumps([url, str(directory), target, spec]) + "\n")
        self._server.stdin.flush()
        return int(self._server.stdout.readline())

    def close(self) -> None:
        assert self._server.stdin is not None
        self._server.stdin.close()
        self._server.wait(timeout=30)


@pytest.fixture(scope="module")  # one LangGraph import for the whole module
def children() -> Iterator[_Children]:
    forks = _Children()
    try:
        yield forks
    finally:
        forks.close()


# The tool's window (effect made, receipt not recorded) is resumed by a new process; the
# other points by a new ledger and saver in this one (the killed child is gone either
# way: its leases are taken over at once). Every point of both model calls and the tool
# call: forked children cost a fraction of a second each, not an import of LangGraph.
_NEW_PROCESS = ("inside[act:call:responded]", "before_commit[step_done:call]")


def test_every_crash_point(
    reference: tuple[list[list[str]], list[str]], tmp_path: Path, children: _Children
) -> None:
    final, points = reference
    for n, point in enumerate(points, start=1):
        directory = tmp_path / str(n)
        directory.mkdir()
        url = f"sqlite:///{directory / 'ledger.db'}"
        with IdempotentServer(directory / "target.json") as server:
            assert children.run(url, directory, server.url, f"at:{n}") == -signal.SIGKILL, point
            if point in _NEW_PROCESS:
                assert children.run(url, directory, server.url, "none") == 0, point
            else:
                child_langgraph.main(url, directory, server.url, "none")
            resources = server.resources()
        assert json.loads((directory / "final.json").read_text()) == final, point
        assert len(resources) == 1, (point, resources)  # one effect
        models = (directory / "counts").read_text().split()
        # a model call runs again only when the crash lost its record (one per crash)
        assert len(models) <= 3, (point, models)


def _note_points(tmp: Path) -> tuple[list[list[str]], list[str]]:
    points = cp.CrashPoints()
    ledger = cp.Ledger(f"sqlite:///{tmp / 'ref.db'}", crash_points=points)
    with CrashproofSaver(ledger=ledger) as saver:
        final = child_langgraph.drive(child_langgraph.build(saver, tmp, "note:review"))
    ledger.close()
    return final, points.passed


@pytest.mark.parametrize("note", ["at_least_once", "at_most_once", "review"])
def test_a_function_tool_declares_its_unknown_outcome(
    tmp_path: Path, children: _Children, monkeypatch: pytest.MonkeyPatch, note: str
) -> None:
    """A plain function (no lookup) as the tool, declared per ``cp.OnUnknown``: killed in
    its act's window (intent committed; effect made, receipt not) and at a seeded sample
    of other points. at_least_once never freezes and delivers once at a deduping target;
    at_most_once never freezes and says "not done"; review is decided in one command and
    the graph, invoked again, finishes."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the operator's key
    (tmp_path / "reference").mkdir()
    final, points = _note_points(tmp_path / "reference")
    numbered = list(enumerate(points, start=1))
    # The act's window: its intent committed, then its effect made and receipt not.
    start = points.index("after_commit[act_intent:call]")
    own = numbered[start : start + 2]
    assert own[1][1] == "before_commit[step_done:call]"
    sample = 0 if note == "review" else 2  # review: the window is where it can freeze
    others = random.Random(38).sample([np for np in numbered if np not in own], sample)
    settled: Counter[str] = Counter()
    for n, point in sorted(own + others):
        directory = tmp_path / str(n)
        directory.mkdir()
        url = f"sqlite:///{directory / 'ledger.db'}"
        target = f"note:{note}"
        assert children.run(url, directory, target, f"at:{n}") == -signal.SIGKILL, point
        try:
            child_langgraph.main(url, directory, target, "none")
        except cp.RunFrozen:
            assert note == "review", point  # a declared tool never freezes
            settled["frozen"] += 1
            with cp.Ledger(url) as ledger:
                (case,) = ledger.review_cases(state="open")
            effects = directory / "effects"
            decision = "--keep" if effects.exists() else "--redo"
            assert main(["review", "decide", case.case_id, decision, "--db", url]) == 0
            child_langgraph.main(url, directory, target, "none")  # the graph, invoked again
        messages = json.loads((directory / "final.json").read_text())
        effects, delivered_to = directory / "effects", directory / "delivered"
        sends = effects.read_text().split().count("x") if effects.exists() else 0
        delivered = delivered_to.read_text().split() if sends else []
        settled["resent"] += sends - 1
        if '"not done"' in messages[2][1]:
            settled["not_done"] += 1
            assert note != "at_least_once", point
        else:
            assert messages == final, point
        assert delivered.count("x") <= 1, point
        if note == "at_least_once":
            assert delivered == ["x"], point  # deduped at the target: delivered once
        else:
            assert sends <= 1, point  # never twice
    expected = {
        "at_least_once": {"resent": 1},  # the effect made, its receipt lost: sent again
        "at_most_once": {"not_done": 2, "resent": -1},
        "review": {"frozen": 2, "not_done": 1},  # --keep where it had been sent
    }[note]
    assert {k: v for k, v in settled.items() if v} == expected
