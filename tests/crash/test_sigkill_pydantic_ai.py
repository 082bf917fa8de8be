"""SIGKILL of a real child at every crash point of a pydantic-ai agent under
``CrashproofDurability`` (``pyd_agents.make_agent``: two model requests; a plain
function tool as a step (run again only when the crash fell between its effect and its
record), a function marked as an effect, and a PR opened by a ``cp.Tool`` with
lookup), killed in a sync or an async workflow (alternately) and resumed in the other
kind, in another process (this one). Every point ends SAME (the uninterrupted run's
answer, each effect once, one PR) or REFUSED (the effect without lookup lost its
receipt: needs_review, never run twice); a model request is asked again only when the
crash lost its answer before the commit. The children fork from a zygote that imported
pydantic-ai once (``child_pydantic_ai.py``), which keeps the matrix within seconds."""

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

import crashproof as cp
import zygote as zygotes
from crashproof.cli import main

sys.path.insert(0, str(Path(__file__).parents[1] / "integrations" / "pydantic_ai"))
import pyd_agents

CHILD = Path(__file__).parent / "child_pydantic_ai.py"
NOTE = "adder:model_request/1:note"
ADD_WINDOW = "before_commit[step_done:adder:model_request/0:add]"
# Where a crash loses a model answer before its commit: it is asked once more.
LOST = {
    "before_commit[step_done:adder:model_request]": "1",
    "before_commit[step_done:adder:model_request#2]": "3",
}

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def zygote() -> Iterator[subprocess.Popen[str]]:
    yield from zygotes.started(CHILD)


def _points(tmp_path: Path) -> list[str]:
    points = cp.CrashPoints()
    with cp.Ledger("memory://", crash_points=points) as ledger:
        wf = pyd_agents.workflow(ledger, pyd_agents.make_agent(tmp_path), "sync")
        assert ledger.run(wf, run_id="r", prompt="go") == "done"
    return points.passed


def test_sigkill_at_every_point_of_the_agent(zygote: subprocess.Popen[str], tmp_path: Path) -> None:
    (tmp_path / "reference").mkdir()
    points = _points(tmp_path / "reference")
    assert "inside[act:adder:model_request/2:open_pr:opened]" in points
    outcomes: Counter[str] = Counter()
    for n, point in enumerate(points, start=1):
        # Killed in one kind of workflow, resumed in the other (their journals are one).
        mode, other = ("sync", "async") if n % 2 else ("async", "sync")
        directory = tmp_path / str(n)
        directory.mkdir()
        url = f"sqlite:///{directory}/runs.db"
        assert zygotes.kill(zygote, url, directory, mode, n) == -signal.SIGKILL, point
        with cp.Ledger(url) as ledger:  # the next process
            wf = pyd_agents.workflow(ledger, pyd_agents.make_agent(directory), other)
            status, outcome = "succeeded", "SAME"
            try:
                assert pyd_agents.drive(ledger, wf, other, prompt="go") == "done", point
            except cp.RunFrozen as frozen:
                status, outcome = frozen.status, "REFUSED"
        if outcome == "REFUSED":
            # Only the effect without lookup may be refused, and only in its window.
            assert status == "needs_review", point
            assert NOTE in point, point
        effects = pyd_agents.lines(directory / "effects")
        # The plain function tool is a step: once, except when the crash fell between its
        # effect and its record (a step's window; mark it EFFECT to close it).
        assert effects.count("5") == (2 if point == ADD_WINDOW else 1), point
        assert effects.count("hi") == (1 if outcome == "SAME" or "step_done" in point else 0)
        prs = json.loads((directory / "prs.json").read_text()) if outcome == "SAME" else {}
        assert list(prs) == (["r/adder:model_request/2:open_pr"] if outcome == "SAME" else [])
        asked = Counter(pyd_agents.lines(directory / "asked"))
        again = {k for k, c in asked.items() if c > 1}
        assert again <= ({LOST[point]} if point in LOST else set()), (point, asked)
        assert all(c <= 2 for c in asked.values()), (point, asked)
        outcomes[outcome] += 1
    assert outcomes["REFUSED"] == 2  # the note's intent and its lost receipt
    assert outcomes["SAME"] == len(points) - 2


# What the note's unknown outcome means (cp.OnUnknown): each of its own crash points and
# a seeded sample of the others, killed and resumed as above. Bounded: SAMPLE more each.
SAMPLE = 2


def _sampled(points: list[str], seed: int, sample: int) -> list[tuple[int, str]]:
    numbered = list(enumerate(points, start=1))
    own = [(n, p) for n, p in numbered if NOTE in p]
    others = random.Random(seed).sample([np for np in numbered if np not in own], sample)
    return sorted(own + others)


@pytest.mark.parametrize("note", ["at_least_once", "at_most_once", "review"])
def test_sigkill_with_the_note_declared(
    zygote: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, note: str
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the operator's key
    (tmp_path / "reference").mkdir()
    points = _points(tmp_path / "reference")
    # review: its own points only (the matrix above freezes nowhere else)
    chosen = _sampled(points, seed=38, sample=0 if note == "review" else SAMPLE)
    settled: Counter[str] = Counter()
    for n, point in chosen:
        mode, other = ("sync", "async") if n % 2 else ("async", "sync")
        directory = tmp_path / str(n)
        directory.mkdir()
        url = f"sqlite:///{directory}/runs.db"
        assert zygotes.kill(zygote, url, directory, f"{mode}/{note}", n) == -signal.SIGKILL
        agent = pyd_agents.make_agent(directory, note=note)
        with cp.Ledger(url) as ledger:
            wf = pyd_agents.workflow(ledger, agent, other)
            try:
                answer = pyd_agents.drive(ledger, wf, other, prompt="go")
            except cp.RunFrozen:
                assert note == "review", point  # a declared tool never freezes
                settled["frozen"] += 1
                (case,) = ledger.review_cases("r", state="open")
                sent = "hi" in pyd_agents.lines(directory / "effects")
                decision = "--keep" if sent else "--redo"  # what the reviewer found
                assert main(["review", "decide", case.case_id, decision, "--db", url]) == 0
                answer = pyd_agents.drive(ledger, wf, other, prompt="go")  # as a worker does
            assert answer == "done", point
            steps = {s.key: s for s in ledger.get_run("r").steps}
        sends = pyd_agents.lines(directory / "effects").count("hi")
        assert pyd_agents.lines(directory / "delivered").count("hi") <= 1, point
        step = steps.get(NOTE)
        settled["resent"] += sends - 1
        if note == "at_least_once":
            assert sends >= 1, point  # sent again under the same operation id
            assert pyd_agents.lines(directory / "delivered") == ["hi"], point
            assert step is not None, point
            assert step.status.value == "succeeded", point
        else:
            assert sends <= 1, point  # never twice
            if step is not None and step.failure == "not_done":
                assert step.status.value == "failed", point  # visible in the journal
                settled["not_done"] += 1
    # Both windows of the note (intent committed; effect made, receipt lost) were hit.
    expected = {
        "at_least_once": {"resent": 1},  # the lost receipt: sent twice, delivered once
        "at_most_once": {"not_done": 2, "resent": -1},  # the intent's window sent nothing
        "review": {"frozen": 2, "not_done": 1},  # --keep where the note had been sent
    }[note]
    assert {k: v for k, v in settled.items() if v} == expected
