"""pydantic-ai's approval-requiring tools under ``CrashproofDurability`` (default
``approvals="crashproof"``): the run waits in ``awaiting_approval`` on the tool call's
own key before anything runs; a signed approval of exactly that call releases it once;
nothing else does. Real ``FunctionModel``, real ledger on SQLite."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent

import crashproof as cp
import zygote as zygotes
from crashproof.integrity.signing import generate_keypair

from .approval_agents import DELETE, OPTIONS, POLICY, make_janitor
from .pyd_agents import lines, workflow

pytestmark = pytest.mark.timeout(60)

MODES = ["sync", "async"]


def _drive(ledger: cp.Ledger, agent: Agent[None, str], mode: str, run_id: str = "r") -> Any:
    wf = workflow(ledger, agent, mode)
    if mode == "async":
        return asyncio.run(ledger.run_async(wf, run_id=run_id, prompt="go", options=OPTIONS))
    return ledger.run(wf, run_id=run_id, prompt="go", options=OPTIONS)


def _ledger(tmp_path: Path, **kw: Any) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{tmp_path}/runs.db", **kw)
    ledger.register_policy(POLICY)
    return ledger


def _alice(tmp_path: Path, ledger: cp.Ledger) -> Path:
    key = tmp_path / "alice.pem"
    if not key.exists():
        generate_keypair(key)
    if "alice" not in ledger.approvers():
        ledger.add_approver("alice", (tmp_path / "alice.pem.pub").read_text(), by="root")
    return key


def _wait(ledger: cp.Ledger, agent: Agent[None, str], mode: str, run_id: str = "r") -> None:
    with pytest.raises(cp.RunFrozen) as frozen:
        _drive(ledger, agent, mode, run_id)
    assert frozen.value.status == "awaiting_approval"


@pytest.mark.parametrize("mode", MODES)
def test_a_requires_approval_tool_waits_before_anything_runs(mode: str, tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        _wait(ledger, make_janitor(tmp_path), mode)
        info = ledger.get_run("r")
        assert info.status == "awaiting_approval"
        assert [s.key for s in info.steps] == ["janitor:model_request"]
        _wait(ledger, make_janitor(tmp_path), mode)  # resumed unapproved: still waits
    assert lines(tmp_path / "effects") == []
    assert lines(tmp_path / "asked") == ["1"]  # no second model request


@pytest.mark.parametrize("mode", MODES)
def test_a_signed_approval_runs_the_tool_once_and_the_model_sees_its_result(
    mode: str, tmp_path: Path
) -> None:
    with _ledger(tmp_path) as ledger:
        _wait(ledger, make_janitor(tmp_path), mode)
        ledger.approve("r", DELETE, key=_alice(tmp_path, ledger), by="alice")
    other = "async" if mode == "sync" else "sync"
    with _ledger(tmp_path) as ledger:  # approved, resumed in another ledger and shell
        assert _drive(ledger, make_janitor(tmp_path), other) == "model saw: deleted a"
        assert _drive(ledger, make_janitor(tmp_path), mode) == "model saw: deleted a"
        info = ledger.get_run("r")
    assert info.status == "succeeded"
    assert [(s.key, s.kind) for s in info.steps] == [
        ("janitor:model_request", "decide"),
        (DELETE, "act"),
        ("janitor:model_request#2", "decide"),
    ]
    assert lines(tmp_path / "effects") == ["a"]
    assert lines(tmp_path / "asked") == ["1", "3"]


def test_the_cli_approves_the_tool_call_by_its_key(tmp_path: Path) -> None:
    from crashproof.cli import ExitCode, main

    url = f"sqlite:///{tmp_path}/runs.db"
    with _ledger(tmp_path) as ledger:
        _wait(ledger, make_janitor(tmp_path), "sync")
        key = str(_alice(tmp_path, ledger))
    other = main(["approve", "r", "janitor:model_request/1:delete", "--key", key, "--db", url])
    assert other != ExitCode.OK  # not the call the run waits on: nothing journaled
    assert main(["approve", "r", DELETE, "--key", key, "--by", "alice", "--db", url]) == 0
    with _ledger(tmp_path) as ledger:
        assert _drive(ledger, make_janitor(tmp_path), "async") == "model saw: deleted a"
    assert lines(tmp_path / "effects") == ["a"]


def test_an_approval_of_another_run_or_step_does_not_release_it(tmp_path: Path) -> None:
    (tmp_path / "r1").mkdir()
    (tmp_path / "r2").mkdir()
    with _ledger(tmp_path) as ledger:
        _wait(ledger, make_janitor(tmp_path / "r1"), "sync", "r1")
        _wait(ledger, make_janitor(tmp_path / "r2"), "sync", "r2")
        key = _alice(tmp_path, ledger)
        with pytest.raises(cp.ApprovalRefused, match="not awaiting approval"):
            ledger.approve("r2", "janitor:model_request/1:delete", key=key, by="alice")
        document = ledger.approve("r1", DELETE, key=key, by="alice")
        with pytest.raises(cp.ApprovalRefused, match="run id"):
            ledger.submit_approval("r2", document, by="mallory")  # r1's, replayed on r2
        _wait(ledger, make_janitor(tmp_path / "r2"), "sync", "r2")
        assert _drive(ledger, make_janitor(tmp_path / "r1"), "sync", "r1") == "model saw: deleted a"
        assert ledger.get_run("r2").status == "awaiting_approval"
    assert lines(tmp_path / "r1" / "effects") == ["a"]
    assert lines(tmp_path / "r2" / "effects") == []


def test_two_calls_in_one_response_wait_for_an_approval_each(tmp_path: Path) -> None:
    second = "janitor:model_request/1:delete"
    with _ledger(tmp_path) as ledger:
        key = _alice(tmp_path, ledger)
        agent = make_janitor(tmp_path, paths=("a", "b"))
        _wait(ledger, agent, "sync")
        ledger.approve("r", DELETE, key=key, by="alice")
        with pytest.raises(cp.ApprovalRefused, match="not awaiting approval"):
            ledger.approve("r", second, key=key, by="alice")  # not asked yet
        _wait(ledger, agent, "async")  # a ran; b waits
        assert lines(tmp_path / "effects") == ["a"]
        ledger.approve("r", second, key=key, by="alice")
        assert _drive(ledger, agent, "sync") == "model saw: deleted a; deleted b"
    assert lines(tmp_path / "effects") == ["a", "b"]
    assert lines(tmp_path / "asked") == ["1", "3"]


def test_a_tool_raising_approval_required_waits_and_runs_once(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        _wait(ledger, make_janitor(tmp_path, raising=True), "async")
        frozen_on = ledger.get_run("r")
        assert [s.key for s in frozen_on.steps] == ["janitor:model_request", DELETE]
        ledger.approve("r", f"{DELETE}#2", key=_alice(tmp_path, ledger), by="alice")
        agent = make_janitor(tmp_path, raising=True)
        assert _drive(ledger, agent, "sync") == "model saw: deleted a"
        assert _drive(ledger, agent, "async") == "model saw: deleted a"
    assert lines(tmp_path / "effects") == ["a"]
    assert lines(tmp_path / "asked") == ["1", "3"]


def test_without_a_policy_asking_an_approval_the_tool_is_refused_not_run(
    tmp_path: Path,
) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        wf = workflow(ledger, make_janitor(tmp_path), "sync")
        with pytest.raises(cp.RunFailed, match="requires approval, but the run's policy"):
            ledger.run(wf, run_id="r", prompt="go")
    assert lines(tmp_path / "effects") == []


def test_a_crash_after_the_approval_is_consumed_runs_the_tool_once(tmp_path: Path) -> None:
    crash = cp.CrashPoints(match=f"after_commit[approval_consumed:{DELETE}]")
    with _ledger(tmp_path, crash_points=crash) as ledger:
        _wait(ledger, make_janitor(tmp_path), "sync")
        ledger.approve("r", DELETE, key=_alice(tmp_path, ledger), by="alice")
        with pytest.raises(cp.SimulatedCrash):
            _drive(ledger, make_janitor(tmp_path), "sync")
    assert crash.fired is not None
    assert lines(tmp_path / "effects") == []
    with _ledger(tmp_path) as ledger:  # the consumed approval still lets it run, once
        assert _drive(ledger, make_janitor(tmp_path), "async") == "model saw: deleted a"
    assert lines(tmp_path / "effects") == ["a"]


def test_a_crash_after_the_tool_effect_freezes_for_review_never_runs_twice(
    tmp_path: Path,
) -> None:
    with _ledger(tmp_path) as ledger:
        _wait(ledger, make_janitor(tmp_path), "sync")
        ledger.approve("r", DELETE, key=_alice(tmp_path, ledger), by="alice")
        with pytest.raises(cp.SimulatedCrash):
            _drive(ledger, make_janitor(tmp_path, crash_after_effect=True), "sync")
    with _ledger(tmp_path) as ledger:
        with pytest.raises(cp.RunFrozen) as frozen:
            _drive(ledger, make_janitor(tmp_path), "sync")
        assert frozen.value.status == "needs_review"
        assert lines(tmp_path / "effects") == ["a"]
        # a reviewer's signed replan is that act's release: it runs again, @2
        case = ledger.review_cases("r", state="open")[0]
        ledger.decide(case.case_id, "replan", key=_alice(tmp_path, ledger), no_reread=True)
        assert _drive(ledger, make_janitor(tmp_path), "async") == "model saw: deleted a"
        assert _drive(ledger, make_janitor(tmp_path), "sync") == "model saw: deleted a"
    assert lines(tmp_path / "effects") == ["a", "a"]


# -- SIGKILL of a real child at every crash point of the approved drive -----------------

CHILD = Path(__file__).parent / "child_approvals.py"
# Between the intent's commit and the receipt's: an act without lookup cannot tell
# whether the effect happened, so the run waits for review; the tool never runs twice.
WINDOW = {f"after_commit[act_intent:{DELETE}]": [], f"before_commit[step_done:{DELETE}]": ["a"]}


@pytest.fixture(scope="module")
def zygote() -> Iterator[subprocess.Popen[str]]:
    yield from zygotes.started(CHILD)


def _approved(directory: Path) -> None:
    """Run ``r`` in ``directory``, waiting for its approval, and approved."""
    directory.mkdir(parents=True, exist_ok=True)
    with _ledger(directory) as ledger:
        _wait(ledger, make_janitor(directory), "sync")
        ledger.approve("r", DELETE, key=_alice(directory, ledger), by="alice")


def test_sigkill_at_every_point_after_the_approval(
    zygote: subprocess.Popen[str], tmp_path: Path
) -> None:
    reference = tmp_path / "reference"
    _approved(reference)
    points = cp.CrashPoints()
    with _ledger(reference, crash_points=points) as ledger:
        assert _drive(ledger, make_janitor(reference), "sync") == "model saw: deleted a"
    assert f"after_commit[approval_consumed:{DELETE}]" in points.passed
    outcomes: Counter[str] = Counter()
    for n, point in enumerate(points.passed, start=1):
        mode, other = ("sync", "async") if n % 2 else ("async", "sync")
        directory = tmp_path / str(n)
        _approved(directory)
        assert (
            zygotes.kill(zygote, f"sqlite:///{directory}/runs.db", directory, mode, n)
            == -signal.SIGKILL
        ), point
        with _ledger(directory) as ledger:  # the next process
            outcome, status = "SAME", "succeeded"
            try:
                assert _drive(ledger, make_janitor(directory), other) == "model saw: deleted a"
            except cp.RunFrozen as frozen:
                outcome, status = "REFUSED", frozen.status
        assert status == ("needs_review" if point in WINDOW else "succeeded"), point
        assert lines(directory / "effects") == WINDOW.get(point, ["a"]), point  # never twice
        outcomes[outcome] += 1
    assert outcomes["SAME"] > 0
    assert outcomes["REFUSED"] > 0


# -- a cp.Tool given for an approval-requiring tool: the same gate, its own lookup -------


def _forge_agent(directory: Path) -> Agent[None, str]:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from crashproof.integrations.pydantic_ai import CrashproofDurability

    from .pyd_agents import Forge

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[ToolCallPart("open_pr", {"title": "fix"}, tool_call_id="p")]
            )
        return ModelResponse(parts=[TextPart("opened")])

    durability = CrashproofDurability(tools={"open_pr": Forge(directory / "prs.json")})
    agent = Agent(FunctionModel(model), name="janitor", capabilities=[durability])

    @agent.tool_plain(requires_approval=True)
    def open_pr(title: str) -> str:
        """Open a PR (performed by the forge)."""
        raise AssertionError("the forge performs open_pr")

    return agent


def test_a_cp_tool_that_requires_approval_waits_and_a_lost_receipt_is_looked_up(
    tmp_path: Path,
) -> None:
    policy = cp.Policy(
        "forge-1", allow={"forge": "1"}, risk={"forge": "high"}, approval_required={"high"}
    )
    options = cp.RunOptions(policy=policy)
    url = f"sqlite:///{tmp_path}/runs.db"
    step = "janitor:model_request/0:open_pr"
    crash = cp.CrashPoints(match=f"inside[act:{step}:opened]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        ledger.register_policy(policy)
        wf = workflow(ledger, _forge_agent(tmp_path), "sync")
        with pytest.raises(cp.RunFrozen, match="needs an approval"):
            ledger.run(wf, run_id="r", prompt="go", options=options)
        assert not (tmp_path / "prs.json").exists()
        ledger.approve("r", step, key=_alice(tmp_path, ledger), by="alice")
        with pytest.raises(cp.SimulatedCrash):  # the PR is opened, its receipt lost
            ledger.run(wf, run_id="r", prompt="go", options=options)
    with cp.Ledger(url) as ledger:
        ledger.register_policy(policy)
        wf = workflow(ledger, _forge_agent(tmp_path), "async")
        assert asyncio.run(ledger.run_async(wf, run_id="r", prompt="go", options=options)) == (
            "opened"
        )
    assert list(json.loads((tmp_path / "prs.json").read_text())) == [f"r/{step}"]


def test_a_cp_tool_that_requires_approval_is_refused_when_the_policy_asks_none(
    tmp_path: Path,
) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        wf = workflow(ledger, _forge_agent(tmp_path), "sync")
        with pytest.raises(cp.RunFailed, match="requires approval, but the run's policy"):
            ledger.run(wf, run_id="r", prompt="go")
    assert not (tmp_path / "prs.json").exists()
