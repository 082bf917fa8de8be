"""The code agent on the model SDKs and two frameworks, each with its plain twin:
``examples/openai_agent.py`` (``openai.OpenAI``), ``openai_agent_async.py``
(``AsyncOpenAI``), ``anthropic_agent.py`` (``anthropic.Anthropic``),
``pydantic_ai_agent.py`` (pydantic-ai) and ``openai_agents_agent.py`` (the OpenAI
Agents SDK), all with the agent's own tools (``cp.models.tool``; the plain twins' tools
are the same functions with their schemas written by hand or derived by the framework;
the LangGraph agent's matrix is ``tests/crash/test_sigkill_langgraph_agent.py``). What an
uninterrupted run does against the plain twin (the same artifacts, the same tool
schemas, no more lines), and a SIGKILL matrix per agent: a
real child (``crashproof.verify._child``) killed at crash points, resumed by another
process: effects once, no recorded decision asked again.

CI kills each agent at ``KILLS`` (every kind of commit that matters: a decision lost and
one recorded, an effect made without its receipt, a multi-act tool between its acts,
the outbox between delivery and its record) and at ``SAMPLE`` more points drawn with a
fixed seed (about 40 s in all on a loaded 2-core machine); the framework agents at one
point (the pull request made, its receipt lost). Every point::

    CRASHPROOF_FULL_MATRIX=1 pytest tests/verify/test_openai_agent.py
    crashproof verify examples.openai_agent:SCENARIO --mode subprocess   # and the others
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from examples import (
    anthropic_agent,
    anthropic_agent_plain,
    openai_agent,
    openai_agent_async,
    openai_agent_async_plain,
    openai_agent_plain,
    openai_agents_agent,
    openai_agents_agent_plain,
    pydantic_ai_agent,
    pydantic_ai_agent_plain,
)
from examples._model_server import turn_key

from crashproof.verify import Case, CaseKind, Reference, Verdict, run_case, run_reference
from crashproof.verify.trial_kit import Mode

ROOT = Path(__file__).resolve().parents[2]
# agent module, its plain twin, the name of its recorder (the decision keys' stem)
AGENTS: dict[str, tuple[ModuleType, ModuleType, str]] = {
    "openai": (openai_agent, openai_agent_plain, "chat"),
    "openai_async": (openai_agent_async, openai_agent_async_plain, "chat"),
    "anthropic": (anthropic_agent, anthropic_agent_plain, "message"),
    # the frameworks name their decisions: the agent's name, then the hook's
    "pydantic_ai": (pydantic_ai_agent, pydantic_ai_agent_plain, pydantic_ai_agent.DECISIONS),
    "openai_agents": (
        openai_agents_agent,
        openai_agents_agent_plain,
        openai_agents_agent.DECISIONS,
    ),
}
FRAMEWORKS = {"pydantic_ai", "openai_agents"}  # fewer points in CI: the kinds, no sample
SEED, SAMPLE = 41, 2


def _operations(run_id: str, name: str) -> set[str]:
    keys = ("4/0:commit", "5/0:create_pull_request/0", "5/0:create_pull_request/1", "6/0:notify")
    return {f"{run_id}/{name}.{key}" for key in keys}


def _references(tmp: Path) -> dict[str, Reference]:
    return {
        agent: run_reference(module.SCENARIO, tmp / agent)[0]
        for agent, (module, _, _) in AGENTS.items()
    }


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reference]:
    return _references(tmp_path_factory.mktemp("references"))


@pytest.mark.parametrize("agent", list(AGENTS))
def test_an_uninterrupted_run_and_the_plain_twin_make_the_same_artifacts(
    agent: str, references: dict[str, Reference], tmp_path: Path
) -> None:
    module, plain, name = AGENTS[agent]
    reference = references[agent]
    turns = {turn_key(k, name): 1 for k in range(len(openai_agent.SCRIPT))}
    assert reference.model_calls == turns  # each turn asked once
    # one commit, one branch, one PR, one message
    assert reference.effects == dict.fromkeys(_operations(module.RUN_ID, name), 1)
    env = module.make_env(tmp_path / "plain")
    try:
        tools = openai_agent_plain.Tools(env.repo, env.forge, env.http)
        result = plain.agent(env.client, tools, openai_agent.TASK)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        assert result == reference.result  # the same conversation's length
        assert env.model.calls() == turns
        assert openai_agent.fingerprint(env) == reference.fingerprint
    finally:
        env.close()


def test_the_agents_tool_schemas_are_the_plain_twins(tmp_path: Path) -> None:
    """The model sees the same tools: cp.models.tool's derived schemas are the ones the
    plain twins write by hand (Chat Completions' and Anthropic's declarations)."""
    env = openai_agent.make_env(tmp_path)
    try:
        tools = openai_agent.agent_tools(env)
    finally:
        env.close()
    chat = [cp_models_spec("chat", t) for t in tools]
    assert chat == openai_agent_plain.TOOLS
    assert [cp_models_spec("message", t) for t in tools] == anthropic_agent_plain.TOOLS


def cp_models_spec(api: str, tool: Any) -> dict[str, Any]:
    from crashproof.models._anthropic import MESSAGES
    from crashproof.models._openai import CHAT

    spec: dict[str, Any] = (CHAT if api == "chat" else MESSAGES).tool_spec(tool)
    return spec


def test_each_crashproof_agent_is_no_longer_than_its_plain_twin() -> None:
    spec = importlib.util.spec_from_file_location("loc", ROOT / "bench" / "loc.py")
    assert spec is not None
    assert spec.loader is not None
    loc: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loc)
    counts = loc.counts()
    assert len(counts) == 2 * len(loc.AGENTS)
    assert {"pydantic-ai agent", "agents sdk agent", "langgraph agent"} <= set(counts)
    for what, (ours, plain) in counts.items():
        assert ours <= plain, f"{what}: {ours} lines with crashproof, {plain} without"


def _kills(name: str, framework: bool = False) -> tuple[str, ...]:
    if framework:  # the PR made, its receipt lost, every decision before it recorded
        return (f"inside[act:{name}.5/0:create_pull_request/1:responded]",)
    return (
        f"before_commit[step_done:{name}#3]",  # a decision lost: asked again, once
        f"after_commit[step_done:{name}#2]",  # a decision recorded: never asked again
        f"inside[act:{name}.4/0:commit:committed]",  # the commit made: found by its trailer
        f"after_commit[step_done:{name}.5/0:create_pull_request/0]",  # between its two acts
        f"inside[act:{name}.5/0:create_pull_request/1:responded]",  # the PR made, no receipt
        f"before_commit[outbox_delivered:{name}.6/0:notify]",  # delivered, not journaled
    )


def _lost(point: str, name: str) -> bool:
    return point.startswith(f"before_commit[step_done:{name}") and ":" not in point.split(
        "step_done:", 1
    )[1].rstrip("]").replace(name, "", 1)


@pytest.mark.timeout(1800)  # every point (make chaos) of an agent on a loaded machine
@pytest.mark.parametrize("agent", list(AGENTS))
def test_sigkill_matrix(agent: str, references: dict[str, Reference], tmp_path: Path) -> None:
    module, _, name = AGENTS[agent]
    reference = references[agent]
    points = reference.points
    kills = set(_kills(name, agent in FRAMEWORKS))
    assert kills <= set(points)
    if os.environ.get("CRASHPROOF_FULL_MATRIX") == "1":
        chosen = set(points)
    else:
        others = sorted(set(points) - kills)
        sample = 0 if agent in FRAMEWORKS else SAMPLE
        chosen = kills | set(random.Random(f"{SEED}:{agent}").sample(others, sample))
    target = f"{module.__name__}:SCENARIO"
    for n, point in enumerate(points, start=1):
        if point not in chosen:
            continue
        case = Case(kind=CaseKind.CRASH, at=n, point=point)
        result = run_case(
            module.SCENARIO, reference, case, tmp_path / str(n), mode="subprocess", target=target
        )
        assert result.verdict is Verdict.SAME, f"{agent} {point}: {result.reason}"
        assert result.extra_effects == {}, point  # effects once
        # No recorded decision asked again: only one whose record the kill lost.
        assert bool(result.reasked) == _lost(point, name), (point, result.reasked)


# The sync agent in the other modes: an in-process crash and a power cut (unsynced
# writes lost), a few points of each kind.
POINTS: dict[str, tuple[str, ...]] = {
    "inproc": (
        "inside[act:chat.2/0:apply_patch:renamed]",  # the patch applied, no receipt
        "after_commit[step_done:chat.3/0:run_tests]",  # the tests' step recorded
        "inside[act:chat.5/0:create_pull_request/0:created]",  # the branch made
        "after_commit[act_intent:chat.5/0:create_pull_request/1]",  # an intent, no PR
        "before_commit[run_succeeded]",
    ),
    "powercut": (
        "after_commit[step_done:chat#4]",  # an unsynced decision lost: asked again
        "inside[act:chat.5/0:create_pull_request/1:responded]",
        "after_commit[step_done:chat.6/0:notify]",  # the message synced before delivery
    ),
}


@pytest.mark.parametrize("mode", list(POINTS))
def test_crash_points_of_each_kind(
    mode: Mode, references: dict[str, Reference], tmp_path: Path
) -> None:
    reference = references["openai"]
    points = reference.points
    target = "examples.openai_agent:SCENARIO"
    for n, point in enumerate(points, start=1):
        if point not in POINTS[mode]:
            continue
        case = Case(kind=CaseKind.CRASH, at=n, point=point)
        result = run_case(
            openai_agent.SCENARIO, reference, case, tmp_path / str(n), mode=mode, target=target
        )
        assert result.verdict is Verdict.SAME, f"{mode} {point}: {result.reason}"
        assert result.extra_effects == {}, point
        lost = _lost(point, "chat") or (
            mode == "powercut" and point == "after_commit[step_done:chat#4]"
        )
        assert bool(result.reasked) == lost, (point, result.reasked)
    assert set(POINTS[mode]) <= set(points)
