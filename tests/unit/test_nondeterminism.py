"""Code that no longer matches a run's journal freezes the run with evidence; it never guesses."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import crashproof as cp

from ._support import FINISH, LedgerFactory

# The recorded history: three steps, then a crash before the outcome committed.
Body = Callable[[cp.Context, Counter[str]], Any]


def original(ctx: cp.Context, calls: Counter[str]) -> Any:
    a = ctx.step("fetch", lambda n: calls.update(["fetch"]) or n, 1)
    b = ctx.decide("plan", lambda n: calls.update(["plan"]) or n + 1, a)
    c = ctx.step("apply", lambda n: calls.update(["apply"]) or n * 10, b)
    return c


def renamed(ctx: cp.Context, calls: Counter[str]) -> Any:
    a = ctx.step("fetch", lambda n: calls.update(["fetch"]) or n, 1)
    return ctx.decide("plan-v2", lambda n: calls.update(["plan"]) or n + 1, a)


def other_kind(ctx: cp.Context, calls: Counter[str]) -> Any:
    a = ctx.step("fetch", lambda n: calls.update(["fetch"]) or n, 1)
    return ctx.step("plan", lambda n: calls.update(["plan"]) or n + 1, a)


def other_args(ctx: cp.Context, calls: Counter[str]) -> Any:
    a = ctx.step("fetch", lambda n: calls.update(["fetch"]) or n, 1)
    return ctx.decide("plan", lambda n, m: calls.update(["plan"]) or n + m, a, m=2)


def returns_early(ctx: cp.Context, calls: Counter[str]) -> Any:
    return ctx.step("fetch", lambda n: calls.update(["fetch"]) or n, 1)


def raises_early(ctx: cp.Context, calls: Counter[str]) -> Any:
    ctx.step("fetch", lambda n: calls.update(["fetch"]) or n, 1)
    raise RuntimeError("the new code gives up here")


def _workflow(body: Body, calls: Counter[str], seen: list[BaseException]) -> cp.Workflow[Any]:
    def run(ctx: cp.Context) -> Any:
        try:
            return body(ctx, calls)
        except cp.NonDeterminismError as exc:
            seen.append(exc)
            raise

    return cp.workflow("evolving")(run)


def _record_history(open_ledger: LedgerFactory) -> Counter[str]:
    calls: Counter[str] = Counter()
    crashing = open_ledger(crash_points=cp.CrashPoints(match=FINISH))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(_workflow(original, calls, []), run_id="r1")
    assert calls == {"fetch": 1, "plan": 1, "apply": 1}
    return calls


@pytest.mark.parametrize(
    ("changed", "expected", "actual"),
    [
        pytest.param(
            renamed, {"key": "plan", "kind": "decide"}, {"key": "plan-v2", "kind": "decide"}
        ),
        pytest.param(
            other_kind, {"key": "plan", "kind": "decide"}, {"key": "plan", "kind": "step"}
        ),
        pytest.param(
            other_args, {"key": "plan", "kind": "decide"}, {"key": "plan", "kind": "decide"}
        ),
    ],
)
def test_a_mismatch_freezes_the_run_with_evidence(
    open_ledger: LedgerFactory, changed: Body, expected: dict[str, str], actual: dict[str, str]
) -> None:
    calls = _record_history(open_ledger)
    seen: list[BaseException] = []
    ledger = open_ledger()

    with pytest.raises(cp.RunFrozen) as caught:
        ledger.run(_workflow(changed, calls, seen), run_id="r1")

    [error] = seen
    assert isinstance(error, cp.NonDeterminismError)
    frozen = caught.value
    assert frozen.status == "needs_review"
    assert frozen.cause is error
    assert "plan" in frozen.reason
    assert calls == {"fetch": 1, "plan": 1, "apply": 1}  # nothing ran again

    info = ledger.get_run("r1")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert info.reason == frozen.reason
    assert info.evidence is not None
    assert info.evidence["expected"].items() >= expected.items()
    assert info.evidence["actual"].items() >= actual.items()
    if changed is other_args:
        assert info.evidence["expected"]["digest"] != info.evidence["actual"]["digest"]
    assert error.evidence == info.evidence


def test_the_run_stays_frozen_when_the_workflow_swallows_the_error(
    open_ledger: LedgerFactory,
) -> None:
    calls = _record_history(open_ledger)
    attempts_after_freeze: list[BaseException] = []

    @cp.workflow("evolving")
    def swallowing(ctx: cp.Context) -> str:
        with contextlib.suppress(cp.NonDeterminismError):
            renamed(ctx, calls)
        try:  # a frozen context refuses every further call
            ctx.step("more", lambda: calls.update(["more"]) or 1)
        except cp.NonDeterminismError as exc:
            attempts_after_freeze.append(exc)
        return "pretend all is well"

    ledger = open_ledger()
    with pytest.raises(cp.RunFrozen) as caught:
        ledger.run(swallowing, run_id="r1")
    assert caught.value.status == "needs_review"
    assert isinstance(caught.value.cause, cp.NonDeterminismError)
    assert len(attempts_after_freeze) == 1
    assert "more" not in calls
    info = ledger.get_run("r1")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert info.result is None


@pytest.mark.parametrize("code", [pytest.param(original, id="old-code"), renamed])
def test_a_frozen_run_stays_frozen_on_later_resumes_and_executes_nothing(
    open_ledger: LedgerFactory, code: Body
) -> None:
    calls = _record_history(open_ledger)
    with pytest.raises(cp.RunFrozen):
        open_ledger().run(_workflow(renamed, calls, []), run_id="r1")
    reason = open_ledger().get_run("r1").reason

    later = open_ledger()
    later.register(_workflow(code, calls, []))
    attempts: list[Callable[[], Any]] = [
        lambda: later.resume("r1"),
        lambda: later.run("evolving", run_id="r1"),
    ]
    for attempt in attempts:
        with pytest.raises(cp.RunFrozen) as caught:
            attempt()
        assert caught.value.status == "needs_review"
        assert caught.value.reason == reason
        assert caught.value.cause is not None
    assert calls == {"fetch": 1, "plan": 1, "apply": 1}
    assert later.get_run("r1").status is cp.RunStatus.NEEDS_REVIEW
    assert later.runs(status="needs_review")[0].run_id == "r1"


def test_returning_while_recorded_steps_remain_freezes(open_ledger: LedgerFactory) -> None:
    calls = _record_history(open_ledger)
    ledger = open_ledger()
    with pytest.raises(cp.RunFrozen) as caught:
        ledger.run(_workflow(returns_early, calls, []), run_id="r1")
    assert caught.value.status == "needs_review"
    info = ledger.get_run("r1")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert info.result is None
    assert info.evidence == {"unreplayed": ["plan", "apply"]}


def test_raising_while_recorded_steps_remain_freezes_instead_of_failing(
    open_ledger: LedgerFactory,
) -> None:
    calls = _record_history(open_ledger)
    ledger = open_ledger()
    with pytest.raises(cp.RunFrozen) as caught:
        ledger.run(_workflow(raises_early, calls, []), run_id="r1")
    assert caught.value.status == "needs_review"
    info = ledger.get_run("r1")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert info.error is None
    assert info.evidence is not None
    assert info.evidence["unreplayed"] == ["plan", "apply"]


def test_an_unchanged_workflow_replays_without_freezing(open_ledger: LedgerFactory) -> None:
    calls = _record_history(open_ledger)
    ledger = open_ledger()
    assert ledger.run(_workflow(original, calls, []), run_id="r1") == 20
    assert ledger.get_run("r1").status is cp.RunStatus.SUCCEEDED
    assert calls == {"fetch": 1, "plan": 1, "apply": 1}
