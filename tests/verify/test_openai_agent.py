"""The code agent on the ``openai`` SDK (``examples/openai_agent.py``): what an
uninterrupted run does, the same agent without crashproof, and the verifier over a
few crash points of each kind in each mode (about 20 s). Every point in every mode:

    crashproof verify examples.openai_agent:SCENARIO                    # about 200 cases
    crashproof verify examples.openai_agent:SCENARIO --mode subprocess
    crashproof verify examples.openai_agent:SCENARIO --mode powercut
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from examples import openai_agent, openai_agent_plain
from examples._model_server import turn_key

from crashproof.verify import Case, CaseKind, Reference, Verdict, run_case, run_reference
from crashproof.verify.trial_kit import Mode

ROOT = Path(__file__).resolve().parents[2]
TARGET = "examples.openai_agent:SCENARIO"
TURNS = {turn_key(k): 1 for k in range(len(openai_agent.SCRIPT))}
OPERATIONS = {
    f"{openai_agent.RUN_ID}/{key}"
    for key in ("chat.4/0:git", "chat.4/1:git", "chat.5/0:open_pr", "chat.6/0:notify")
}


def test_an_uninterrupted_run_and_the_plain_agent_make_the_same_artifacts(
    tmp_path: Path,
) -> None:
    reference, _ = run_reference(openai_agent.SCENARIO, tmp_path / "crashproof")
    assert reference.model_calls == TURNS  # each turn asked once
    assert reference.effects == dict.fromkeys(OPERATIONS, 1)  # one commit, branch, PR, message
    calls = sum(len(tool_calls) for _, tool_calls in openai_agent.SCRIPT)
    assert reference.result == 2 + len(openai_agent.SCRIPT) + calls  # the messages
    env = openai_agent.make_env(tmp_path / "plain")
    try:
        tools = openai_agent_plain.Tools(env.repo, env.forge, env.http)
        assert openai_agent_plain.agent(env.client, tools, openai_agent.TASK) == reference.result
        assert env.model.calls() == TURNS
        assert openai_agent.fingerprint(env) == reference.fingerprint
    finally:
        env.close()


def test_the_crashproof_agent_is_no_longer_than_the_plain_one() -> None:
    spec = importlib.util.spec_from_file_location("loc", ROOT / "bench" / "loc.py")
    assert spec is not None
    assert spec.loader is not None
    loc: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loc)
    counts = loc.counts()
    for what, (ours, plain) in counts.items():
        assert ours <= plain, f"{what}: {ours} lines with crashproof, {plain} without"


# The points CI crashes at, per mode, chosen by kind; the full matrix is in the docstring.
POINTS: dict[str, tuple[str, ...]] = {
    "inproc": (
        "after_commit[step_done:chat#2]",  # a decision recorded: never asked again
        "before_commit[step_done:chat#3]",  # a decision lost: asked again, once
        "inside[act:chat.2/0:edit_file:renamed]",  # the patch applied, no receipt
        "after_commit[step_done:chat.3/0:run_tests]",  # the tests' step recorded
        "inside[act:chat.4/0:git:committed]",  # the commit made: found by its trailer
        "inside[act:chat.4/1:git:created]",  # the branch made: found at its sha
        "after_commit[act_intent:chat.5/0:open_pr]",  # an intent, no PR: looked up, sent once
        "before_commit[outbox_delivered:chat.6/0:notify]",  # delivered, not journaled
        "before_commit[run_succeeded]",
    ),
    "subprocess": ("inside[act:chat.5/0:open_pr:responded]",),  # the PR made, SIGKILL
    "powercut": (
        "after_commit[step_done:chat#4]",  # an unsynced decision lost: asked again
        "inside[act:chat.5/0:open_pr:responded]",
        "after_commit[step_done:chat.6/0:notify]",  # the message synced before delivery
    ),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    ref, _ = run_reference(openai_agent.SCENARIO, tmp_path_factory.mktemp("reference"))
    return ref


@pytest.mark.parametrize("mode", list(POINTS))
def test_crash_points_of_each_kind(mode: Mode, reference: Reference, tmp_path: Path) -> None:
    points = reference.points
    for n, point in enumerate(points, start=1):
        if point not in POINTS[mode]:
            continue
        case = Case(kind=CaseKind.CRASH, at=n, point=point)
        result = run_case(
            openai_agent.SCENARIO, reference, case, tmp_path / str(n), mode=mode, target=TARGET
        )
        assert result.verdict is Verdict.SAME, f"{mode} {point}: {result.reason}"
        assert result.extra_effects == {}, point
        lost = point.startswith("before_commit[step_done:chat#") or (
            mode == "powercut" and point == "after_commit[step_done:chat#4]"
        )
        assert bool(result.reasked) == lost, (point, result.reasked)
    assert set(POINTS[mode]) <= set(points)
