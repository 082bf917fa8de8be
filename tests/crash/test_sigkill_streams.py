"""SIGKILL mid-stream: a real child consumes a streamed agent run (pydantic-ai's
``run_stream_events``, the Agents SDK's ``Runner.run_streamed``) and is killed while
consuming its N-th event of the uninterrupted run's stream; a new child resumes the
run. Each ends with the uninterrupted run's output, every effect once at its target,
and the model asked only for answers no record holds: the uninterrupted run's count,
plus at most one (a request in flight in the framework's own task when the consumer
died), never a recorded one again. A seeded sample of ``SAMPLE`` events per framework
(``STREAM_KILLS``; ``make chaos`` kills at every event). LangGraph's streaming matrix
is in test_sigkill_langgraph_prebuilt.py."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared zygote
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from model_server import ModelServer, Turn

import zygote as zygotes

HERE = Path(__file__).parent
pytestmark = pytest.mark.timeout(300)
_NONCE = re.compile(r"\s*\[[0-9a-f]{12}\]")
# Events killed at per framework (seeded; the first and the last always): 6 in
# `make test` (~30 s), every event with a large count in `make chaos`.
SAMPLE = int(os.environ.get("STREAM_KILLS", "6"))

PYDANTIC_AI = [Turn(calls=(("note", '{"text": "hi"}'),)), Turn("done")]
AGENTS = [
    Turn("look", (("add", '{"x": 5}'), ("note", '{"text": "hi"}'), ("open_pr", '{"title": "x"}'))),
    Turn("done"),
]


@pytest.fixture(scope="module")
def pydantic_ai_zygote() -> Iterator[subprocess.Popen[str]]:
    yield from zygotes.started(HERE / "child_stream_pydantic_ai.py")


@pytest.fixture(scope="module")
def agents_zygote() -> Iterator[subprocess.Popen[str]]:
    yield from zygotes.started(HERE / "child_stream_openai_agents.py")


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _run(zygote: subprocess.Popen[str], script: list[Turn], directory: Path, spec: str) -> Any:
    """A child under ``spec`` and, if it was killed, one resuming the run: the first
    exit code, the model's requests, the output and the events of the last child."""
    directory.mkdir()
    url = f"sqlite:///{directory / 'ledger.db'}"
    with ModelServer(script=script, by_turn=True) as model:
        first = zygotes.kill(zygote, url, directory, model.url, spec)
        if first == -signal.SIGKILL:
            zygotes.kill(zygote, url, directory, model.url, "none")
        requests = model.count
    error = directory / "error.txt"
    assert not error.exists(), (spec, error.read_text() if error.exists() else "")
    out = json.loads((directory / "out.json").read_text())
    return first, requests, _NONCE.sub("", str(out["output"])), out["events"]


def _matrix(zygote: subprocess.Popen[str], script: list[Turn], tmp: Path) -> list[Path]:
    first, requests, output, events = _run(zygote, script, tmp / "reference", "none")
    assert first == 0
    assert requests == len(script)
    assert output == "done"
    assert 5 <= len(events) <= 60  # bounds the matrix: one child pair per event
    extra = 0
    directories = []
    middle = random.Random(41).sample(
        range(2, len(events)), max(0, min(SAMPLE - 2, len(events) - 2))
    )
    for n in sorted({1, len(events), *middle}):
        spec = f"event:{n}"
        got = _run(zygote, script, tmp / str(n), spec)
        assert got[0] == -signal.SIGKILL, spec
        assert got[2] == output, spec
        assert len(script) <= got[1] <= len(script) + 1, (spec, got[1])
        extra += got[1] - len(script)
        directories.append(tmp / str(n))
    assert extra <= max(1, SAMPLE // 2)  # most kills cost no request at all
    return directories


def test_pydantic_ai_run_stream_events(
    pydantic_ai_zygote: subprocess.Popen[str], tmp_path: Path
) -> None:
    for directory in _matrix(pydantic_ai_zygote, PYDANTIC_AI, tmp_path):
        # an effect without lookup, sent again only after an unknown outcome
        assert _lines(directory / "delivered") == ["hi"], directory.name
        assert 1 <= len(_lines(directory / "effects")) <= 2, directory.name


def test_agents_sdk_run_streamed(agents_zygote: subprocess.Popen[str], tmp_path: Path) -> None:
    for directory in _matrix(agents_zygote, AGENTS, tmp_path):
        prs = json.loads((directory / "prs.json").read_text())
        assert len(prs) == 1, directory.name  # the forge's act: once, looked up
        assert _lines(directory / "delivered") == ["hi"], directory.name  # deduped once
