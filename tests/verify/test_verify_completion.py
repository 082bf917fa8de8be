"""Completion evidence at every crash point: a run that must end with a passing test run at
the tree it leaves reaches the same verdict after a crash anywhere, between its last edit
and its last check too (verify_scenarios.VERIFIED, and its unverified twin below)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from verify_scenarios import VERIFIED, FileEnv, make_env, run_calc_tests

import crashproof as cp
from crashproof.verify import Verdict, verify


@pytest.mark.parametrize("mode", ["inproc", "subprocess", "powercut"])
def test_a_verified_run_is_the_same_after_a_crash_at_every_point(mode: str) -> None:
    """In process at every point; the subprocess and power-cut modes at a seeded 12 in
    make test, at every point under CRASHPROOF_FULL_MATRIX=1 (make chaos)."""
    full = mode == "inproc" or os.environ.get("CRASHPROOF_FULL_MATRIX") == "1"
    report = verify(VERIFIED, mode=mode, seed=1, recovery_points=0, max_points=None if full else 12)
    assert report.ok, [
        (r.case.label, r.reason) for r in report.results if r.verdict is not Verdict.SAME
    ]
    points = report.reference.points
    # The window the issue names: after the last edit's receipt, before the last check's.
    assert "after_commit[step_done:notes]" in points
    assert "before_commit[step_done:tests#2]" in points
    assert all(r.verdict is Verdict.SAME for r in report.results)
    assert len(report.results) >= (len(points) if full else 12)


def unverified(env: FileEnv) -> cp.Workflow[Any]:
    """VERIFIED without its last check: the notes edit comes after the last passing tests."""
    ws = cp.Workspace(env.root / "ws")

    @cp.workflow("verified", version="1", completion=cp.Completion(require=["tests"]))
    def flow(ctx: cp.Context) -> dict[str, Any]:
        answer = ctx.decide("ask", env.ask, "ask")
        ctx.act("fix", ws, op="write", path="calc.py", content="def add(a, b):\n    return a + b\n")
        first = ctx.check("tests", lambda: run_calc_tests(str(ws.root)))
        ctx.act("notes", ws, op="write", path="NOTES.md", content=answer + "\n")
        return {"first": first.passed}

    return flow


def test_an_unverified_run_stops_with_the_same_reason_after_a_crash_at_every_point(
    tmp_path: Path,
) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    counting = cp.CrashPoints()
    env = make_env(reference)
    ledger = cp.Ledger(f"sqlite:///{reference / 'ledger.db'}", crash_points=counting)
    with pytest.raises(cp.Unverified) as stopped:
        ledger.run(unverified(env), run_id="r")
    reason = stopped.value.reason
    assert reason.startswith("unverified: act 'notes' changed ")
    expected_tree = cp.Workspace(env.root / "ws").fingerprint()
    for at in range(1, len(counting.passed) + 1):
        trial = tmp_path / f"crash-{at}"
        trial.mkdir()
        env = make_env(trial)
        crashing = cp.Ledger(f"sqlite:///{trial / 'ledger.db'}", crash_points=cp.CrashPoints(at=at))
        with pytest.raises((cp.SimulatedCrash, cp.Unverified)):
            crashing.run(unverified(env), run_id="r")
        asked = env.calls().get("ask", 0)
        resumed = cp.Ledger(f"sqlite:///{trial / 'ledger.db'}")
        recorded = resumed.store.get_run("r") is not None and any(
            e.key == "ask" for e in resumed.journal("r")
        )
        with pytest.raises(cp.Unverified) as stopped:  # a restart runs it again: a resume
            resumed.run(unverified(env), run_id="r")
        point = counting.passed[at - 1]
        assert stopped.value.reason.replace(str(trial), "") == reason.replace(str(reference), ""), (
            point
        )
        assert cp.Workspace(env.root / "ws").fingerprint() == expected_tree, point
        # A recorded decision is never asked again; one the crash lost is asked once more.
        assert env.calls() == {"ask": asked if recorded else asked + 1}, point
        info = resumed.get_run("r")
        assert info.status is cp.RunStatus.STOPPED, point
