"""The verifier fails when it should: broken tools and steps are caught as DIVERGED, an
honest refusal is REFUSED with its reason, and every failure names its seed."""

from __future__ import annotations

import pytest
import verify_scenarios as sc

import crashproof as cp
from crashproof.testing import assert_recovery_equivalent
from crashproof.verify import CaseKind, Scenario, ScenarioError, Verdict, verify


def test_a_tool_that_is_not_idempotent_diverges() -> None:
    report = verify(sc.LEAKY, seed=1234, recovery_points=1)
    assert not report.ok
    crashes = {r.case.point: r for r in report.of_kind(CaseKind.CRASH)}
    # Effect written, receipt not journaled: recovery executes it again, blindly.
    for k in range(3):
        lost = crashes[f"before_commit[step_done:send-{k}]"]
        assert lost.verdict is Verdict.DIVERGED
        assert "duplicated effect" in lost.reason
        assert lost.extra_effects == {f"verify:leaky/send-{k}": 1}
    # Intent journaled, effect not yet done: executing it once more is right.
    assert crashes["after_commit[act_intent:send-1]"].verdict is Verdict.SAME
    assert crashes["after_commit[step_done:send-1]"].verdict is Verdict.SAME


def test_a_local_step_with_an_outside_effect_has_no_intent() -> None:
    report = verify(sc.STEP_WITH_EFFECT, seed=0, recovery_points=0)
    (reference,) = report.of_kind(CaseKind.REFERENCE)
    assert reference.verdict is Verdict.DIVERGED
    assert "effect without intent: verify:step-with-effect/notify" in reference.reason
    assert not report.ok


def test_a_tool_that_cannot_look_up_is_refused_never_repeated() -> None:
    report = verify(sc.NO_LOOKUP, seed=0, recovery_points=1, contention_points=0)
    assert report.ok  # REFUSED is acceptable...
    refused = {
        r.case.point: r for r in report.of_kind(CaseKind.CRASH) if r.verdict is Verdict.REFUSED
    }
    assert {"after_commit[act_intent:send]", "before_commit[step_done:send]"} <= set(refused)
    for r in refused.values():  # ...never silent
        assert r.reason.startswith("needs_review: ")
        assert "cannot look it up" in r.reason
        assert all(n <= 0 for n in r.extra_effects.values())


def test_every_failure_names_its_seed() -> None:
    with pytest.raises(AssertionError) as failure:
        assert_recovery_equivalent(sc.LEAKY, seed=4242, recovery_points=1)
    message = str(failure.value)
    assert "seed 4242" in message
    assert "--seed 4242" in message  # the command that replays it
    assert "DIVERGED" in message
    assert "crash matrix: leaky (inproc), seed 4242" in message
    assert "duplicated effect" in message


def test_sampling_is_reproducible_from_the_seed() -> None:
    first = verify(sc.TINY, seed=99, max_points=4, recovery_points=1)
    again = verify(sc.TINY, seed=99, max_points=4, recovery_points=1)
    other = verify(sc.TINY, seed=100, max_points=4, recovery_points=1)
    labels = [r.case.label for r in first.results]
    assert labels == [r.case.label for r in again.results]
    assert labels != [r.case.label for r in other.results]
    assert len(first.of_kind(CaseKind.CRASH)) == 4
    assert first.ok


def test_subprocess_mode_needs_an_importable_scenario() -> None:
    local = Scenario(
        name="local",
        workflow_factory=sc.tiny,
        env_factory=sc.make_env,
        fingerprint=sc.file_fingerprint,
    )
    with pytest.raises(ScenarioError, match="MODULE:ATTRIBUTE"):
        verify(local, mode="subprocess")


def test_a_reference_run_that_fails_is_a_scenario_error() -> None:
    def failing(env: sc.FileEnv) -> cp.Workflow[None]:
        @cp.workflow("failing", version="1")
        def flow(ctx: cp.Context) -> None:
            ctx.step("boom", lambda: 1 / 0)

        return flow

    broken = Scenario(
        name="failing",
        workflow_factory=failing,
        env_factory=sc.make_env,
        fingerprint=sc.file_fingerprint,
    )
    with pytest.raises(ScenarioError, match="did not succeed"):
        verify(broken)
