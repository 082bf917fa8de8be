"""Power-cut mode: every crash point of every example scenario, after which the ledger
keeps only what its last forced sync made durable. Output-triggered durability must still
end SAME everywhere; a runtime that skips the sync before an act's execute must not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from examples import code_agent, patch_task

import crashproof.integrity.witness as witness_module
import crashproof.runtime.driving.durability as durable
from crashproof.verify import CaseKind, Report, Verdict, verify
from crashproof.verify.patch_scenario import PATCH_TASK
from crashproof.verify.powercut import DurableSnapshots


def assert_all_same(report: Report) -> None:
    for r in report.results:
        assert r.verdict is Verdict.SAME, f"{r.case.label}: {r.verdict.value} {r.reason}"


@pytest.fixture(scope="module")
def patch_report() -> Report:
    return verify(patch_task.SCENARIO, mode="powercut", seed=0, recovery_points=1)


def test_the_patch_example_is_same_at_every_crash_point(patch_report: Report) -> None:
    assert patch_report.mode == "powercut"
    points = patch_report.reference.points
    assert len(patch_report.of_kind(CaseKind.CRASH)) == len(points) == 68
    assert len(patch_report.of_kind(CaseKind.DOUBLE_CRASH)) == len(points) - 1
    assert_all_same(patch_report)


def test_a_power_cut_loses_the_unsynced_decisions(patch_report: Report) -> None:
    """Unlike a process crash, a power cut takes back the model decisions committed since
    the last output point: they are asked again, and nothing outside noticed."""
    reasked = {r.case.point: r.reasked for r in patch_report.of_kind(CaseKind.CRASH)}
    for k in range(8):
        # Decided and committed (unsynced), the act's intent not yet durable: lost.
        assert reasked[f"after_commit[step_done:s{k}:plan]"] == (f"s{k}:plan",)
        assert reasked[f"before_commit[act_intent:s{k}]"] == (f"s{k}:plan",)
        # The intent's forced sync made the decision durable with it.
        assert reasked[f"after_commit[act_intent:s{k}]"] == ()
    for r in patch_report.of_kind(CaseKind.CRASH):
        assert r.extra_effects == {}


@pytest.mark.parametrize(
    "scenario", [PATCH_TASK, code_agent.SCENARIO], ids=["builtin-patch", "code-agent"]
)
def test_the_other_scenarios_are_same_at_every_crash_point(scenario: object) -> None:
    """Every point under CRASHPROOF_FULL_MATRIX=1 (make chaos); a seeded 16 in make test
    (the patch task above runs at every point in both)."""
    most = None if os.environ.get("CRASHPROOF_FULL_MATRIX") == "1" else 16
    report = verify(scenario, mode="powercut", seed=1, recovery_points=0, max_points=most)  # type: ignore[arg-type]
    points = len(report.reference.points)
    assert len(report.of_kind(CaseKind.CRASH)) == (points if most is None else min(most, points))
    assert_all_same(report)


def test_skipping_the_sync_before_execute_is_caught_as_diverged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(durable, "_UNSAFE_SKIP_INTENT_SYNC", True)
    report = verify(patch_task.SCENARIO, mode="powercut", seed=0, recovery_points=0)
    diverged = {r.case.point: r.reason for r in report.results if r.verdict is Verdict.DIVERGED}
    # The first effect lands with its intent unsynced; a cut after it loses the intent, and
    # the resumed run does the effect again.
    assert "inside[act:s0:renamed]" in diverged
    assert "duplicated effect" in diverged["inside[act:s0:renamed]"]
    assert not report.ok


def test_the_same_wrong_variant_passes_a_process_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why power-cut mode exists: a SIGKILL-style crash keeps unsynced writes, so it
    cannot see a missing sync."""
    monkeypatch.setattr(durable, "_UNSAFE_SKIP_INTENT_SYNC", True)
    report = verify(patch_task.SCENARIO, mode="inproc", seed=0, max_points=12, recovery_points=0)
    assert report.counts()["DIVERGED"] == 0


def test_snapshots_refuse_a_store_that_never_forces_a_sync(tmp_path: Path) -> None:
    from crashproof.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "l.db", durability="full")
    try:
        with pytest.raises(ValueError, match="output"):
            DurableSnapshots(tmp_path / "l.db", tmp_path / "durable").attach(store)
    finally:
        store.close()


def test_the_witness_is_cut_with_the_ledger(tmp_path: Path) -> None:
    """The witness's files are kept as of its own last sync, apart from the ledger's."""
    report = verify(patch_task.SCENARIO, mode="powercut", seed=0, max_points=8, recovery_points=0)
    assert_all_same(report)
    from crashproof.verify.trial_kit import durable_snapshots, open_ledger

    with open_ledger(tmp_path, powercut=True) as ledger:
        snapshots = durable_snapshots(tmp_path)
        assert (snapshots.witness_directory / "ledger.db.witness").exists()
        assert ledger.witness is not None
        before = (snapshots.witness_directory / "ledger.db.witness-wal").read_bytes()
        ledger.witness.start("r")  # a durable write: a snapshot of its own
        after = (snapshots.witness_directory / "ledger.db.witness-wal").read_bytes()
        assert len(after) > len(before)
        assert not snapshots.directory.exists()  # no forced sync of the ledger yet


def test_an_unsynced_witness_is_caught_as_refused_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The witness before issue #38: synchronous=NORMAL, so a power cut can keep a run's
    synced intent and lose its witness row. Every resume after such a cut is refused
    (WitnessMissing); the synced witness never is (the tests above)."""
    monkeypatch.setattr(witness_module, "_UNSAFE_UNSYNCED", True)
    report = verify(patch_task.SCENARIO, mode="powercut", seed=0, max_points=8, recovery_points=0)
    refused = [r for r in report.results if r.verdict is Verdict.DIVERGED]
    assert refused
    assert all("WitnessMissing" in r.reason for r in refused)
    assert not report.ok
