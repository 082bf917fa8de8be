"""SIGKILL of a real child at every crash point of an OpenAI Agents SDK run on a
``durable_agent`` (two model calls over the real SDK and ``openai`` client to the local
Responses server in this process; a step, an effect without lookup, a PR through a
``cp.Tool`` with lookup; the SDK runs the three tools concurrently), resumed in this
process: SAME, or REFUSED for the effect in its own window; each effect once; a model
call asked again only when the crash lost its answer before the commit."""

from __future__ import annotations

import asyncio
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

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).parents[2]))
from model_server import ModelServer
from tests.integrations.openai_agents import test_runner as oa

CHILD = Path(__file__).parent / "child_openai_agents.py"
NOTE = "helper:model/1:note"
ADD_WINDOW = "before_commit[step_done:helper:model/0:add]"
LOST = {
    "before_commit[step_done:helper:model]": 0,
    "before_commit[step_done:helper:model#2]": 1,
}

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer(oa.SCRIPT, by_turn=True) as s:
        yield s


@pytest.fixture(scope="module")
def zygote() -> Iterator[subprocess.Popen[str]]:
    yield from zygotes.started(CHILD)


def _turns(requests: list[dict[str, object]]) -> Counter[int]:
    from model_server import _responses_turns

    return Counter(_responses_turns(r["body"]["input"]) for r in requests)  # type: ignore[index]


def test_sigkill_at_every_point_of_the_runner(
    server: ModelServer, zygote: subprocess.Popen[str], tmp_path: Path
) -> None:
    (tmp_path / "reference").mkdir()
    points = cp.CrashPoints()
    with cp.Ledger("memory://", crash_points=points) as ledger:
        wf = oa.workflow(ledger, oa.make(tmp_path / "reference", server.url), "async")
        asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))
    assert "inside[act:helper:model/2:open_pr:opened]" in points.passed
    outcomes: Counter[str] = Counter()
    for n, point in enumerate(points.passed, start=1):
        directory = tmp_path / str(n)
        directory.mkdir()
        url = f"sqlite:///{directory}/runs.db"
        del server.requests[:]
        assert zygotes.kill(zygote, url, directory, server.url, n) == -signal.SIGKILL, point
        with cp.Ledger(url) as ledger:
            wf = oa.workflow(ledger, oa.make(directory, server.url), "async")
            status, outcome = "succeeded", "SAME"
            try:
                out = asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))
                assert out.startswith("done ["), point
            except cp.RunFrozen as frozen:
                status, outcome = frozen.status, "REFUSED"
        if outcome == "REFUSED":
            assert status == "needs_review", point
            assert NOTE in point, point
        effects = oa.lines(directory / "effects")
        assert effects.count("5") == (2 if point == ADD_WINDOW else 1), point
        assert effects.count("hi") <= 1, point
        if outcome == "SAME":
            assert effects.count("hi") == 1, point
            prs = json.loads((directory / "prs.json").read_text())
            assert list(prs) == ["r/helper:model/2:open_pr"], point
        asked = _turns(server.requests)
        again = {t for t, c in asked.items() if c > 1}
        assert again <= ({LOST[point]} if point in LOST else set()), (point, asked)
        outcomes[outcome] += 1
    assert outcomes["REFUSED"] == 2
    assert outcomes["SAME"] == len(points.passed) - 2


# What the note's unknown outcome means (cp.OnUnknown): each of its own crash points and
# a seeded sample of the others, killed and resumed as above. Bounded: SAMPLE more each.
SAMPLE = 2


@pytest.mark.parametrize("note", ["at_least_once", "at_most_once", "review"])
def test_sigkill_with_the_note_declared(
    server: ModelServer,
    zygote: subprocess.Popen[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    note: str,
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the operator's key
    (tmp_path / "reference").mkdir()
    points = cp.CrashPoints()
    with cp.Ledger("memory://", crash_points=points) as ledger:
        wf = oa.workflow(ledger, oa.make(tmp_path / "reference", server.url), "async")
        asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))
    numbered = list(enumerate(points.passed, start=1))
    own = [(n, p) for n, p in numbered if NOTE in p]
    # review: its own points only (the matrix above freezes nowhere else)
    sample = 0 if note == "review" else SAMPLE
    others = random.Random(38).sample([np for np in numbered if np not in own], sample)
    settled: Counter[str] = Counter()
    for n, point in sorted(own + others):
        directory = tmp_path / str(n)
        directory.mkdir()
        url = f"sqlite:///{directory}/runs.db"
        fields = (url, directory, f"{server.url}|{note}", n)
        assert zygotes.kill(zygote, *fields) == -signal.SIGKILL, point
        with cp.Ledger(url) as ledger:
            wf = oa.workflow(ledger, oa.make(directory, server.url, note), "async")
            try:
                out = asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))
            except cp.RunFrozen:
                assert note == "review", point  # a declared tool never freezes
                settled["frozen"] += 1
                (case,) = ledger.review_cases("r", state="open")
                decision = "--keep" if "hi" in oa.lines(directory / "effects") else "--redo"
                assert main(["review", "decide", case.case_id, decision, "--db", url]) == 0
                out = asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))
            assert out.startswith("done ["), point
            step = next((s for s in ledger.get_run("r").steps if s.key == NOTE), None)
        sends = oa.lines(directory / "effects").count("hi")
        settled["resent"] += sends - 1
        assert oa.lines(directory / "delivered").count("hi") <= 1, point
        if note == "at_least_once":
            assert oa.lines(directory / "delivered") == ["hi"], point  # deduped at the target
            assert step is not None, point
            assert step.status.value == "succeeded", point
        else:
            assert sends <= 1, point  # never twice
            if step is not None and step.failure == "not_done":
                assert step.status.value == "failed", point  # visible in the journal
                settled["not_done"] += 1
    expected = {
        "at_least_once": {"resent": 1},  # the lost receipt: sent twice, delivered once
        "at_most_once": {"not_done": 2, "resent": -1},  # the intent's window sent nothing
        "review": {"frozen": 2, "not_done": 1},  # --keep where the note had been sent
    }[note]
    assert {k: v for k, v in settled.items() if v} == expected
