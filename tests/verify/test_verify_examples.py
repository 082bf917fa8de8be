"""The examples verified at every crash point (the async code agent at a seeded sample
and inside each of its commands; at every point under CRASHPROOF_FULL_MATRIX=1, as `make
chaos` runs it): all SAME (or REFUSED with a reason)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from examples import async_agent, code_agent, patch_task
from examples.code_agent import commands

from crashproof.verify import (
    Case,
    CaseKind,
    Report,
    Verdict,
    run_case,
    run_reference,
    verify,
)
from crashproof.verify.patch_scenario import PATCH_TASK
from crashproof.verify.report import DEFAULT_CONTENTION_POINTS
from crashproof.verify.runner import recovery_candidates


def assert_equivalent(report: Report) -> None:
    for r in report.results:
        assert r.verdict is not Verdict.DIVERGED, f"{r.case.label}: {r.reason}"
        if r.verdict is Verdict.REFUSED:
            assert r.reason.strip(), f"{r.case.label} refused without a reason"


@pytest.fixture(scope="module")
def patch_report() -> Report:
    return verify(patch_task.SCENARIO, mode="inproc", seed=0, recovery_points=1)


@pytest.fixture(scope="module")
def agent_report() -> Report:
    return verify(code_agent.SCENARIO, mode="inproc", seed=0, recovery_points=0)


def test_patch_task_every_crash_point(patch_report: Report) -> None:
    points = patch_report.reference.points
    assert len(points) == 68  # 8 steps x (decision, intent, temp file, rename, receipt) + run
    assert len(patch_report.of_kind(CaseKind.CRASH)) == len(points)
    assert len(patch_report.of_kind(CaseKind.DOUBLE_CRASH)) == len(points) - 1
    assert [r.verdict for r in patch_report.of_kind(CaseKind.REDELIVERY)] == [Verdict.SAME]
    # On by default, bounded: two recoverers (racing, taking over) and a stale checkpoint
    # at DEFAULT_CONTENTION_POINTS crash points.
    assert len(patch_report.of_kind(CaseKind.TWO_RECOVERERS)) == 2 * DEFAULT_CONTENTION_POINTS
    assert len(patch_report.of_kind(CaseKind.STALE_CHECKPOINT)) == DEFAULT_CONTENTION_POINTS
    assert_equivalent(patch_report)
    assert patch_report.counts() == {"SAME": len(patch_report.results), "REFUSED": 0, "DIVERGED": 0}


def test_patch_task_asks_again_only_what_a_crash_lost(patch_report: Report) -> None:
    reasked = {r.case.point: r.reasked for r in patch_report.of_kind(CaseKind.CRASH) if r.reasked}
    assert reasked == {f"before_commit[step_done:s{k}:plan]": (f"s{k}:plan",) for k in range(8)}
    for r in patch_report.of_kind(CaseKind.CRASH):
        assert r.extra_effects == {}
        assert r.model_calls == 8 + len(r.reasked)


def test_the_demo_task_and_the_example_make_the_same_artifact(tmp_path: Path) -> None:
    builtin, _ = run_reference(PATCH_TASK, tmp_path / "builtin")
    example, _ = run_reference(patch_task.SCENARIO, tmp_path / "example")
    assert builtin.fingerprint == example.fingerprint
    assert len(builtin.fingerprint) == 64


def test_code_agent_every_crash_point(agent_report: Report) -> None:
    points = agent_report.reference.points
    assert 30 <= len(points) < 100
    for inside in ("edit:greet.py:renamed", "commit:committed", "branch:created"):
        assert f"inside[act:{inside}]" in points
    for key, _ in code_agent.commands():  # cp.Shell: ran, and recorded
        assert {f"inside[act:{key}:exited]", f"inside[act:{key}:recorded]"} <= set(points)
    assert "inside[act:open-pr:responded]" in points
    assert len(agent_report.of_kind(CaseKind.CRASH)) == len(points)
    assert len(agent_report.of_kind(CaseKind.STALE_CHECKPOINT)) == DEFAULT_CONTENTION_POINTS
    assert_equivalent(agent_report)
    effects = agent_report.reference.effects or {}
    assert set(effects) == {
        f"{code_agent.RUN_ID}/{key}" for key in ("commit", "branch", "open-pr", "notify")
    } | {f"{code_agent.RUN_ID}/migrate:{name}" for name in code_agent.MIGRATIONS}
    assert agent_report.reference.model_calls == {"plan": 1, "commit-message": 1}


def test_the_code_agent_installs_formats_and_tests_through_the_shell(tmp_path: Path) -> None:
    """The install from the local wheel, the formatter and the tests ran as commands, and
    what they did is the artifact: the vendored package, the reformatted file (committed
    so), their outcome in the pull request."""
    run_reference(code_agent.SCENARIO, tmp_path)
    repo = tmp_path / "env" / "repo"
    assert (repo / "vendor" / "greetlib.py").read_text() == code_agent.WHEEL_FILES["greetlib.py"]
    committed = code_agent._git(repo, "show", "agent/greet-by-name:test_greet.py")
    assert committed == (repo / "test_greet.py").read_text().strip()
    assert 'greet("Ada")' in committed  # the seed's single quotes, formatted
    edited = code_agent._git(repo, "show", "agent/greet-by-name:greet.py")
    assert edited == 'def greet(name: str) -> str:\n    return f"Hello, {name}!"'  # the agent's too
    assert "Tests pass; 2 file(s) reformatted" in (tmp_path / "env" / "forge.json").read_text()


@pytest.mark.parametrize("point", ["inside[act:commit:committed]", "inside[act:open-pr:responded]"])
def test_code_agent_crash_during_recovery(point: str, agent_report: Report, tmp_path: Path) -> None:
    """The commit made but not acknowledged (found again by its trailer); the PR created but
    not acknowledged (found again by its key): crash the recovery itself, then resume."""
    single = next(r for r in agent_report.of_kind(CaseKind.CRASH) if r.case.point == point)
    for m in recovery_candidates(single.recovery_points)[:2]:
        case = Case(
            kind=CaseKind.DOUBLE_CRASH,
            at=single.case.at,
            point=point,
            recovery_at=m,
            recovery_point=single.recovery_points[m - 1],
        )
        result = run_case(code_agent.SCENARIO, agent_report.reference, case, tmp_path / str(m))
        assert result.verdict is Verdict.SAME, result.reason
        assert result.extra_effects == {}


def test_patch_task_with_real_sigkills() -> None:
    report = verify(
        patch_task.SCENARIO,
        mode="subprocess",
        seed=7,
        max_points=5,
        recovery_points=1,
        contention_points=0,  # child-process contention: test_verify_contention.py
    )
    assert report.mode == "subprocess"
    assert report.target == "examples.patch_task:SCENARIO"
    assert len(report.of_kind(CaseKind.CRASH)) == 5
    assert 1 <= len(report.of_kind(CaseKind.DOUBLE_CRASH)) <= 5
    assert_equivalent(report)
    assert not report.refused


# make test: the async agent at a seeded sample of its crash points, and inside each of
# its commands (the sync agent above runs every point); make chaos: every point.
ASYNC_POINTS = None if os.environ.get("CRASHPROOF_FULL_MATRIX") == "1" else 12


def test_the_async_code_agent_at_its_crash_points(tmp_path: Path) -> None:
    """The async agent (async model, AsyncHttpTool, sync tools in threads) crashed in
    process; its reference writes what the sync agent's does."""
    report = verify(
        async_agent.SCENARIO, mode="inproc", seed=0, max_points=ASYNC_POINTS, recovery_points=0
    )
    points = report.reference.points
    crashed = {r.case.point for r in report.of_kind(CaseKind.CRASH)}
    assert len(crashed) == (len(points) if ASYNC_POINTS is None else ASYNC_POINTS)
    assert_equivalent(report)
    assert not report.refused
    inside = {f"inside[act:{key}:{at}]" for key, _ in commands() for at in ("exited", "recorded")}
    inside |= {"inside[act:commit:committed]", "inside[act:open-pr:responded]"}
    for point in sorted(inside - crashed):  # each command cut short, then recorded
        case = Case(kind=CaseKind.CRASH, at=points.index(point) + 1, point=point)
        result = run_case(async_agent.SCENARIO, report.reference, case, tmp_path / point)
        assert result.verdict is Verdict.SAME, f"{point}: {result.reason}"
        assert result.extra_effects == {}, point
        assert not result.reasked, point
    assert report.reference.model_calls == {"plan": 1, "commit-message": 1}
    sync, _ = run_reference(code_agent.SCENARIO, tmp_path / "sync")
    assert report.reference.fingerprint == sync.fingerprint
    assert report.reference.effects == sync.effects
    assert report.reference.steps == sync.steps
    assert report.reference.points == sync.points


@pytest.mark.parametrize("mode", ["subprocess", "powercut"])
def test_the_async_code_agent_with_real_sigkills_and_power_cuts(mode: str) -> None:
    report = verify(
        async_agent.SCENARIO,
        mode=mode,  # type: ignore[arg-type]
        seed=3,
        max_points=6,
        recovery_points=1,
        contention_points=0,
    )
    assert len(report.of_kind(CaseKind.CRASH)) == 6
    assert_equivalent(report)
    assert not report.refused
