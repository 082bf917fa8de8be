"""Two recoverers at once, and a stale checkpoint: the examples hold (no DIVERGED), and a
tool without dedupe is caught where only these cases can catch it."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import verify_scenarios as sc
from examples import code_agent, patch_task

from crashproof.cli import main
from crashproof.runtime.operations import transfer
from crashproof.verify import Case, CaseKind, Report, Verdict, run_case, verify
from crashproof.verify.report import DEFAULT_CONTENTION_POINTS
from crashproof.verify.runner import recovery_candidates

NEW_KINDS = (CaseKind.TWO_RECOVERERS, CaseKind.STALE_CHECKPOINT)


def assert_not_diverged(report: Report) -> None:
    for r in report.results:
        assert r.verdict is not Verdict.DIVERGED, f"{r.case.label}: {r.reason}"
        if r.verdict is Verdict.REFUSED:
            assert r.reason.strip(), f"{r.case.label} refused without a reason"


def variants(report: Report) -> list[str | None]:
    return [r.case.variant for r in report.of_kind(CaseKind.TWO_RECOVERERS)]


def test_code_agent_with_two_recoverers_and_a_stale_checkpoint() -> None:
    """(Both examples also run DEFAULT_CONTENTION_POINTS of these in
    test_verify_examples.py, where every crash point is verified.)"""
    report = verify(
        code_agent.SCENARIO,
        seed=5,
        max_points=8,
        recovery_points=0,
        contention_points=3,
    )
    assert_not_diverged(report)
    assert sorted(variants(report), key=str) == ["race"] * 3 + ["take-over"] * 3
    stale = report.of_kind(CaseKind.STALE_CHECKPOINT)
    assert len(stale) == 3
    take_overs = [r for r in report.of_kind(CaseKind.TWO_RECOVERERS) if r.case.variant != "race"]
    assert all(r.case.recovery_point for r in take_overs)
    # The first recoverer is fenced out, unless the take-over came after its last commit.
    assert any("fenced out (StaleLeaseError)" in r.reason for r in take_overs)
    for r in report.of_kind(CaseKind.TWO_RECOVERERS):
        assert r.extra_effects == {}, r.case.label
    for r in stale:  # a move continues SAME; the stale copy is refused every way
        assert r.verdict is Verdict.SAME, r.reason
        assert "(a) same ledger refused it" in r.reason
        assert "accepted a checkpoint" not in r.reason, r.reason
        assert "(b) witnessed ledger refused it" in r.reason
        assert "(c) copy REFUSED" in r.reason or "(c) the copy of an ended run" in r.reason
    counts = report.kind_counts()
    assert sum(counts["two-recoverers"].values()) == 6
    assert sum(counts["stale-checkpoint"].values()) == 3


def test_patch_task_stale_checkpoint_before_the_first_act(tmp_path: Path) -> None:
    """The gap this closes: a checkpoint taken before the first act holds no observation
    of the workspace, and the workspace's append does not dedupe by operation id. As a
    move, the source can no longer go on (so the checkpoint cannot go stale) and the
    continuation ends SAME; as a copy, taken stale, it is imported frozen."""
    report = verify(patch_task.SCENARIO, seed=0, max_points=1, contention_points=0)
    point = "after_commit[step_done:s0:plan]"
    at = report.reference.points.index(point) + 1
    case = Case(kind=CaseKind.STALE_CHECKPOINT, at=at, point=point)
    result = run_case(patch_task.SCENARIO, report.reference, case, tmp_path)
    assert result.verdict is Verdict.SAME, result.reason
    assert result.fingerprint == report.reference.fingerprint
    assert result.extra_effects == {}
    assert "(move) the source refused to resume" in result.reason
    assert "(a) same ledger refused it" in result.reason
    assert "(b) witnessed ledger refused it" in result.reason
    assert "(c) copy REFUSED: needs_review: imported from a copy" in result.reason


def test_patch_task_two_recoverers_as_child_processes() -> None:
    report = verify(
        patch_task.SCENARIO,
        mode="subprocess",
        seed=3,
        max_points=2,
        recovery_points=0,
        contention_points=1,
    )
    assert_not_diverged(report)
    assert sorted(variants(report), key=str) == ["race", "take-over"]
    assert len(report.of_kind(CaseKind.STALE_CHECKPOINT)) == 1
    race = next(r for r in report.of_kind(CaseKind.TWO_RECOVERERS) if r.case.variant == "race")
    take = next(r for r in report.of_kind(CaseKind.TWO_RECOVERERS) if r.case.variant != "race")
    assert race.verdict is Verdict.SAME
    assert take.verdict is Verdict.SAME
    assert "recoverer" in race.reason or race.reason == ""


def test_a_tool_without_dedupe_is_caught_only_by_the_take_over(tmp_path: Path) -> None:
    """Its lookup makes every single crash SAME; a fenced-out recoverer about to execute
    writes the effect the one that took over already wrote: DIVERGED."""
    report = verify(sc.LOOKUP_ONLY, seed=0, recovery_points=1, contention_points=0)
    assert report.ok, [r.reason for r in report.diverged]
    point = "after_commit[act_intent:send]"
    single = next(r for r in report.of_kind(CaseKind.CRASH) if r.case.point == point)
    after_start = single.case.at - 1  # crash before the intent: the recovery journals it
    before = next(r for r in report.of_kind(CaseKind.CRASH) if r.case.at == after_start)
    m = before.recovery_points.index(point) + 1
    assert m in recovery_candidates(before.recovery_points)
    case = Case(
        kind=CaseKind.TWO_RECOVERERS,
        at=before.case.at,
        point=before.case.point,
        recovery_at=m,
        recovery_point=point,
        variant="take-over",
    )
    result = run_case(sc.LOOKUP_ONLY, report.reference, case, tmp_path / "take-over")
    assert result.verdict is Verdict.DIVERGED
    assert "duplicated effect: verify:lookup-only/send landed 2x" in result.reason
    assert result.extra_effects == {"verify:lookup-only/send": 1}
    # The same case on a tool that dedupes (the workspace) stays SAME.
    tiny = verify(sc.TINY, seed=0, recovery_points=0, contention_points=0)
    good = next(r for r in tiny.of_kind(CaseKind.CRASH) if r.case.point.endswith("[act_intent:a]"))
    k = good.case.at - 1
    prior = next(r for r in tiny.of_kind(CaseKind.CRASH) if r.case.at == k)
    ok_case = Case(
        kind=CaseKind.TWO_RECOVERERS,
        at=k,
        point=prior.case.point,
        recovery_at=prior.recovery_points.index(good.case.point) + 1,
        recovery_point=good.case.point,
        variant="take-over",
    )
    fine = run_case(sc.TINY, tiny.reference, ok_case, tmp_path / "tiny")
    assert fine.verdict is Verdict.SAME, fine.reason
    assert "fenced out (StaleLeaseError)" in fine.reason


def test_a_stale_checkpoint_on_a_tool_without_lookup_is_refused_not_redone() -> None:
    """The tool can neither look its effect up nor observe the environment changed. A
    move cannot go stale (its source refuses to go on): the continuation is SAME; the
    stale copy is installed frozen: REFUSED, nothing done twice."""
    report = verify(sc.NO_LOOKUP, seed=0, recovery_points=0, contention_points=None)
    stale = report.of_kind(CaseKind.STALE_CHECKPOINT)
    assert stale
    assert_not_diverged(report)
    # Nothing done twice (a REFUSED case may stop short of an effect: -1).
    assert all(n < 1 for r in stale for n in r.extra_effects.values())
    assert any("(c) copy REFUSED: needs_review" in r.reason for r in stale)


def test_a_copy_imported_runnable_is_caught_as_diverged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime fault switched on: copies installed runnable, as before moves. The
    verifier catches the stale copy redoing the effect the run did after the export."""
    monkeypatch.setattr(transfer, "_UNSAFE_COPY_RUNNABLE", True)
    report = verify(sc.NO_LOOKUP, seed=0, recovery_points=0, contention_points=None)
    diverged = [
        r for r in report.of_kind(CaseKind.STALE_CHECKPOINT) if r.verdict is Verdict.DIVERGED
    ]
    assert diverged
    assert all("not frozen as a copy" in r.reason for r in diverged)
    assert any(
        "(c) resuming the imported copy changed the environment" in r.reason for r in diverged
    )


def test_cli_prints_counts_per_kind(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["verify", "verify_scenarios:TINY", "--seed", "4", "--recovery-points", "0"]
    capsys.readouterr()
    assert main([*argv, "--contention-points", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 two-recoverers cases, 2 stale checkpoints" in out
    assert "per kind: reference S 1 | redelivery S 1 | crash S 18 | two-recoverers S 4" in out
    assert main([*argv, "--contention-points", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sum(report["kind_counts"]["two-recoverers"].values()) == 2
    assert sum(report["kind_counts"]["stale-checkpoint"].values()) == 1
    assert report["repro"].endswith("--recovery-points 0 --contention-points 1")
    assert main([*argv, "--contention-points", "some"]) != 0


def test_contention_is_on_by_default_and_bounded() -> None:
    """``crashproof verify`` runs the new kinds unless told not to; the CLI's default
    (spelled out there, so plain commands never import the verifier) is the library's."""
    from crashproof.cli.commands.proofs import verify_recovery as verify_command

    report = verify(sc.TINY, seed=1, recovery_points=0)
    assert report.contention_points == DEFAULT_CONTENTION_POINTS == 2
    assert len(report.of_kind(CaseKind.STALE_CHECKPOINT)) == DEFAULT_CONTENTION_POINTS
    assert "--contention-points" not in report.repro()
    default = inspect.signature(verify_command).parameters["contention_points"].default
    assert default == str(DEFAULT_CONTENTION_POINTS)


def test_options_bound_and_disable_the_new_kinds() -> None:
    none = verify(sc.TINY, seed=1, recovery_points=0, contention_points=0)
    assert not [r for r in none.results if r.case.kind in NEW_KINDS]
    powercut = verify(sc.TINY, mode="powercut", seed=1, max_points=2, recovery_points=0)
    assert not [r for r in powercut.results if r.case.kind in NEW_KINDS]
    with pytest.raises(ValueError, match="contention_points"):
        verify(sc.TINY, contention_points=-1)
    same = verify(sc.TINY, seed=9, recovery_points=0, contention_points=2)
    again = verify(sc.TINY, seed=9, recovery_points=0, contention_points=2)
    labels = [r.case.label for r in same.results if r.case.kind in NEW_KINDS]
    assert labels == [r.case.label for r in again.results if r.case.kind in NEW_KINDS]
    assert len(labels) == 6
