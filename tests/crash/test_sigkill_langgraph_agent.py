"""SIGKILL of a real child running the LangGraph code agent (``examples.langgraph_agent``:
``create_react_agent`` with ``durable_model``, ``durable_tools`` over the agent's
``cp.models.tool`` functions, CrashproofSaver), resumed by a new process with
``start_or_resume``. Each kill ends as the uninterrupted run does: the same result and
fingerprint (tree, git, forge), every commit, branch, pull request and message made
once, and the model asked only for an answer no record held (at most one more request
than the uninterrupted run).

CI kills at the pull request made without its receipt and at one checkpointer write
drawn with a fixed seed. Every ledger crash point and
every checkpointer write: ``LANGGRAPH_AGENT_KILLS=all`` (``make chaos``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt")
pytest.importorskip("langchain_openai")

CHILD = Path(__file__).parent / "child_langgraph_agent.py"
pytestmark = pytest.mark.timeout(1800)  # every point (make chaos) on a loaded machine
FULL = os.environ.get("LANGGRAPH_AGENT_KILLS") == "all"
# The pull request made, its receipt lost: found again, never made twice.
POINTS = ("inside[act:call:responded]",)


class _Children:
    """Child processes forked by one that imported LangGraph once (``serve``)."""

    def __init__(self) -> None:
        self._server = subprocess.Popen(
            [sys.executable, str(CHILD), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, directory: Path, spec: str) -> int:
        assert self._server.stdin is not None
        assert self._server.stdout is not None
        self._server.stdin.write(json.dumps([str(directory), spec]) + "\n")
        self._server.stdin.flush()
        return int(self._server.stdout.readline())

    def close(self) -> None:
        assert self._server.stdin is not None
        self._server.stdin.close()
        self._server.wait(timeout=60)


@pytest.fixture(scope="module")
def children() -> Iterator[_Children]:
    forks = _Children()
    try:
        yield forks
    finally:
        forks.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, children: _Children) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("reference")
    assert children.run(directory, "count") == 0
    outcome = json.loads((directory / "result.json").read_text())
    return {**outcome, **json.loads((directory / "counts.json").read_text())}


def test_the_reference_run(reference: dict[str, Any]) -> None:
    assert reference["result"] == 15  # the plain twin's conversation: 15 messages
    assert len(reference["created"]) == 2  # the pull request and the message
    assert len(reference["commits"]) == 1
    assert set(reference["created"].values()) | set(reference["commits"].values()) == {1}
    assert reference["model_calls"] == {f"chat#{k}" if k > 1 else "chat": 1 for k in range(1, 8)}
    assert set(POINTS) | {"inside[act:call:committed]"} <= set(reference["points"])


def _kill(children: _Children, reference: dict[str, Any], directory: Path, spec: str) -> None:
    assert children.run(directory, spec) == -signal.SIGKILL, spec
    assert children.run(directory, "none") == 0, spec
    outcome = json.loads((directory / "result.json").read_text())
    assert outcome["result"] == reference["result"], spec
    assert outcome["fingerprint"] == reference["fingerprint"], spec
    # effects once: as many as the reference made, each once
    assert sorted(outcome["created"].values()) == [1] * len(reference["created"]), spec
    assert sorted(outcome["commits"].values()) == [1] * len(reference["commits"]), spec
    # no recorded decision asked again: at most the one answer the kill cut short
    calls, expected = outcome["model_calls"], reference["model_calls"]
    extra = {k: n - expected.get(k, 0) for k, n in calls.items() if n != expected.get(k, 0)}
    assert set(extra.values()) <= {1}, (spec, extra)
    assert len(extra) <= 1, (spec, extra)


def test_kills(reference: dict[str, Any], children: _Children, tmp_path: Path) -> None:
    points = list(enumerate(reference["points"], start=1))
    if FULL:
        specs = [f"ledger:{n}" for n, _ in points]
        specs += [f"saver:{n}" for n in range(1, reference["writes"] + 1)]
    else:
        specs = [f"ledger:{n}" for n, point in points if point in POINTS]
        specs.append(f"saver:{random.Random(41).randint(1, reference['writes'])}")
    for spec in specs:
        _kill(children, reference, tmp_path / spec.replace(":", "-"), spec)


def test_the_plain_twin_makes_the_same_artifacts(reference: dict[str, Any], tmp_path: Path) -> None:
    """``langgraph_agent_plain.py`` (no crashproof) against the same servers: the same
    conversation's length, tree, git and forge records, each turn asked once."""
    sys.path.insert(0, str(Path(__file__).parents[2]))
    from examples import langgraph_agent, langgraph_agent_plain, openai_agent, openai_agent_plain

    env = langgraph_agent.make_env(tmp_path)
    try:
        tools = openai_agent_plain.Tools(env.repo, env.forge, env.http)
        result = langgraph_agent_plain.agent(env.model.url, tools, openai_agent.TASK)
        assert result == reference["result"]
        assert openai_agent.fingerprint(env) == reference["fingerprint"]
        assert env.model.calls() == reference["model_calls"]
    finally:
        env.close()
