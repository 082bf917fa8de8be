"""A real child process killed by SIGKILL at every crash point of the 8-step patch
scenario (each side of every journal commit) and inside a decision and a step body,
then resumed in a fresh process-local ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashproof.verify.demo import crash_and_resume, crash_points_of
from crashproof.verify.patch_scenario import STEPS

# 2 commits per step x 8 steps x 2 sides + run_started + run_succeeded, both sides.
EXPECTED_POINTS = 2 * (2 * STEPS + 2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str, int, Path]:
    root = tmp_path_factory.mktemp("patch")
    points, fingerprint, calls = crash_points_of(root)
    return points, fingerprint, calls, root


def test_reference_run_exposes_every_commit_boundary(reference: tuple[list[str], str, int, Path]):
    points, _, calls, _ = reference
    assert len(points) == EXPECTED_POINTS
    assert points[0] == "before_commit[run_started]"
    assert points[-1] == "after_commit[run_succeeded]"
    assert calls == STEPS


@pytest.mark.parametrize("n", range(1, EXPECTED_POINTS + 1))
def test_sigkill_at_commit_boundary(n: int, reference: tuple[list[str], str, int, Path]) -> None:
    points, fingerprint, _, root = reference
    point = points[n - 1]
    outcome = crash_and_resume(root, f"at:{n}", point)
    assert outcome.killed, "the child must die by SIGKILL at the crash point"
    assert outcome.fingerprint == fingerprint
    lost = (
        point[len("before_commit[step_done:") : -1] if "before_commit[step_done:" in point else None
    )
    # A decision is asked again only if the crash lost its answer before the commit.
    assert outcome.reasked == ([lost] if lost and lost.endswith(":plan") else [])
    assert outcome.model_calls == STEPS + (1 if lost and lost.endswith(":plan") else 0)
    # A recorded step body never runs again; one whose commit was lost runs once more.
    assert outcome.rerun == ([lost] if lost and lost.endswith(":apply") else [])


@pytest.mark.parametrize("key", ["s0:plan", "s4:plan", "s7:plan", "s0:apply", "s6:apply"])
def test_sigkill_inside_a_step(key: str, reference: tuple[list[str], str, int, Path]) -> None:
    _, fingerprint, _, root = reference
    outcome = crash_and_resume(root, f"inside:{key}", f"inside[{key}]")
    assert outcome.killed
    assert outcome.fingerprint == fingerprint
    if key.endswith(":plan"):
        assert outcome.reasked == [key]  # asked once more, and only once
        assert outcome.model_calls == STEPS + 1
        assert outcome.rerun == []
    else:
        assert outcome.reasked == []
        assert outcome.rerun == [key]
