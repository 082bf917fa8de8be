"""Workflow versions: a run resumes only on code that says it can replay its version."""

from __future__ import annotations

from pathlib import Path

import pytest

import crashproof as cp


def v1() -> cp.Workflow[list[str]]:
    @cp.workflow("deploy", version="1")
    def deploy(ctx: cp.Context) -> list[str]:
        out = [ctx.step("build", lambda: "built")]
        out.append(ctx.step("ship", lambda: "shipped-v1"))
        return out

    return deploy


def v2(compatible: tuple[str, ...]) -> cp.Workflow[list[str]]:
    @cp.workflow("deploy", version="2", compatible_with=compatible)
    def deploy(ctx: cp.Context) -> list[str]:
        out = [ctx.step("build", lambda: "built")]
        if ctx.patched("canary-ship"):
            out.append(ctx.step("canary", lambda: "canary-v2"))
        else:  # runs that passed this point under v1 keep the v1 branch
            out.append(ctx.step("ship", lambda: "shipped-v1"))
        return out

    return deploy


def crashed_v1(tmp_path: Path, point: str = "before_commit[run_succeeded]") -> None:
    points = cp.CrashPoints(match=point)
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(v1(), run_id="d1")
    ledger.close()


def test_a_run_is_refused_by_code_that_does_not_claim_its_version(tmp_path: Path) -> None:
    crashed_v1(tmp_path)
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(cp.UnknownWorkflow, match=r"version '1'.*compatible_with"):
        ledger.run(v2(()), run_id="d1")
    assert ledger.get_run("d1").status is cp.RunStatus.RUNNING  # nothing changed
    assert [s.key for s in ledger.get_run("d1").steps] == ["build", "ship"]


def test_compatible_code_finishes_old_runs_on_the_old_branch(tmp_path: Path) -> None:
    crashed_v1(tmp_path)
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    assert ledger.run(v2(("1",)), run_id="d1") == ["built", "shipped-v1"]
    assert ledger.run(v2(("1",)), run_id="d2") == ["built", "canary-v2"]  # new runs: new
    assert ledger.get_run("d1").version == "1"  # the run keeps the version it started on


def test_a_run_that_had_not_reached_the_change_takes_the_new_branch(tmp_path: Path) -> None:
    crashed_v1(tmp_path, "after_commit[step_done:build]")
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    assert ledger.run(v2(("1",)), run_id="d1") == ["built", "canary-v2"]
