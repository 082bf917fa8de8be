"""A real child process killed by SIGKILL at the crash points of the 8-step patch task
(``crashproof.verify.patch_scenario``: each step a model decision, then an append to a real
file through a Workspace), then resumed by a new Ledger object in this process and judged
by the verifier: the reference's fingerprint, each line exactly once, and no recorded
decision asked again (one lost before its commit is asked exactly once more).

Every crash point of steps s0 and s6 (the seed's step that wrote its patch twice) and of
the run's start and end is killed here; the demo and ``crashproof verify ... --mode
subprocess`` cover all of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashproof.verify import Case, CaseKind, Reference, Verdict, run_case, run_reference
from crashproof.verify.patch_scenario import PATCH_TASK, RUN_ID, STEPS
from crashproof.verify.runner import recovery_candidates

TARGET = "crashproof.verify.patch_scenario:PATCH_TASK"


def expected_points() -> list[str]:
    """Per step: the decision's commit, the intent's commit, the workspace's temp file
    written and renamed, the receipt's commit; each commit seen from both sides."""
    points = ["before_commit[run_started]", "after_commit[run_started]"]
    for k in range(STEPS):
        for label in (f"step_done:s{k}:plan", f"act_intent:s{k}"):
            points += [f"before_commit[{label}]", f"after_commit[{label}]"]
        points += [f"inside[act:s{k}:written]", f"inside[act:s{k}:renamed]"]
        points += [f"before_commit[step_done:s{k}]", f"after_commit[step_done:s{k}]"]
    return [*points, "before_commit[run_succeeded]", "after_commit[run_succeeded]"]


POINTS = expected_points()
KILLED = [
    n
    for n, point in enumerate(POINTS, start=1)
    if "run_" in point or any(f":s{k}" in point for k in (0, 6))
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    ref, rows = run_reference(PATCH_TASK, tmp_path_factory.mktemp("patch-ref"))
    assert [r.verdict for r in rows] == [Verdict.SAME, Verdict.SAME], rows
    return ref


def test_reference_run_exposes_every_crash_window(reference: Reference) -> None:
    assert list(reference.points) == POINTS
    assert len(POINTS) == 8 * STEPS + 4
    assert reference.effects == {f"{RUN_ID}/s{k}": 1 for k in range(STEPS)}
    assert reference.model_calls == {f"s{k}:plan": 1 for k in range(STEPS)}
    assert len(reference.fingerprint) == 64


@pytest.mark.parametrize("at", KILLED, ids=[POINTS[n - 1] for n in KILLED])
def test_sigkill_at_crash_point(at: int, reference: Reference, tmp_path: Path) -> None:
    point = POINTS[at - 1]
    case = Case(kind=CaseKind.CRASH, at=at, point=point)
    result = run_case(PATCH_TASK, reference, case, tmp_path, mode="subprocess", target=TARGET)
    assert result.verdict is Verdict.SAME, result.reason
    assert result.fingerprint == reference.fingerprint
    assert result.extra_effects == {}
    # A decision is asked again only if the kill fell between its answer and its commit.
    lost = point[len("before_commit[step_done:") : -1] if point.endswith(":plan]") else None
    if lost and point.startswith("before"):
        assert result.reasked == (lost,)
        assert result.model_calls == STEPS + 1
    else:
        assert result.reasked == ()
        assert result.model_calls == STEPS


def test_sigkill_during_recovery(reference: Reference, tmp_path: Path) -> None:
    point = "inside[act:s3:renamed]"  # the line is in the file, its receipt is not journaled
    at = POINTS.index(point) + 1
    single = run_case(
        PATCH_TASK,
        reference,
        Case(kind=CaseKind.CRASH, at=at, point=point),
        tmp_path / "single",
        mode="subprocess",
        target=TARGET,
    )
    assert single.verdict is Verdict.SAME, single.reason
    for m in recovery_candidates(single.recovery_points)[:2]:
        case = Case(
            kind=CaseKind.DOUBLE_CRASH,
            at=at,
            point=point,
            recovery_at=m,
            recovery_point=single.recovery_points[m - 1],
        )
        directory = tmp_path / f"double-{m}"
        directory.mkdir()
        double = run_case(PATCH_TASK, reference, case, directory, mode="subprocess", target=TARGET)
        assert double.verdict is Verdict.SAME, double.reason
        assert double.fingerprint == reference.fingerprint
