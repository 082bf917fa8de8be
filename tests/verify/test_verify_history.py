"""The history check on hand-made histories: intents, duplicates, losses, decisions."""

from __future__ import annotations

from typing import Any

from crashproof import RunInfo, RunStatus, StepInfo, StepKind, StepStatus
from crashproof.verify import Reference
from crashproof.verify.history import (
    CrashSnapshot,
    Observation,
    check_decisions,
    check_effects,
    check_journal,
    check_reference,
)


def act(key: str, status: StepStatus = StepStatus.SUCCEEDED) -> StepInfo:
    return StepInfo(key=key, kind=StepKind.ACT, status=status, attempts=1, operation_id=f"r/{key}")


def run(*steps: StepInfo) -> RunInfo:
    return RunInfo(
        run_id="r",
        workflow="w",
        version="1",
        status=RunStatus.SUCCEEDED,
        input={},
        input_digest="d",
        created_at=0.0,
        updated_at=0.0,
        steps=steps,
    )


def reference(**overrides: Any) -> Reference:
    fields: dict[str, Any] = {
        "fingerprint": "f" * 64,
        "result": None,
        "points": ("p",),
        "effects": {"r/a": 1, "r/b": 1},
        "model_calls": {"plan": 1, "msg": 1},
        "steps": (("a", "act", "succeeded"), ("b", "act", "succeeded")),
        "seconds": 0.0,
    }
    return Reference(**{**fields, **overrides})


def seen(info: RunInfo, effects: dict[str, int]) -> Observation:
    return Observation(info=info, fingerprint="f" * 64, effects=effects, model_calls=None)


def test_equal_histories_pass() -> None:
    obs = seen(run(act("a"), act("b")), {"r/a": 1, "r/b": 1})
    assert check_effects(reference(), obs, finished=True) == ([], {})
    assert check_journal(reference(), obs.info) == []
    assert check_reference(obs) == []


def test_a_duplicated_effect() -> None:
    problems, extra = check_effects(
        reference(), seen(run(act("a"), act("b")), {"r/a": 2, "r/b": 1}), finished=True
    )
    assert problems == ["duplicated effect: r/a landed 2x, the reference 1x"]
    assert extra == {"r/a": 1}


def test_an_effect_without_intent() -> None:
    problems, _ = check_effects(
        reference(), seen(run(act("a"), act("b")), {"r/a": 1, "r/b": 1, "r/x": 1}), finished=True
    )
    assert problems == ["effect without intent: r/x landed 1x, no act has this id"]
    assert check_reference(seen(run(act("a")), {"r/a": 1, "r/x": 1})) == [
        "effect without intent: r/x (no act of the journal has this id)"
    ]


def test_a_lost_effect_counts_only_when_acknowledged_or_finished() -> None:
    in_flight = run(act("a"), act("b", StepStatus.RUNNING))
    assert check_effects(reference(), seen(in_flight, {"r/a": 1}), finished=False)[0] == []
    acked = run(act("a"), act("b"))
    problems, _ = check_effects(reference(), seen(acked, {"r/a": 1}), finished=False)
    assert problems == ["lost effect: r/b landed 0x though its receipt is journaled"]


def test_an_act_left_in_flight_by_a_finished_run() -> None:
    info = run(act("a"), act("b", StepStatus.UNKNOWN))
    problems = check_journal(reference(), info)
    assert problems[0] == "acts left unreconciled: b"
    assert problems[1].startswith("journal differs at step 2")


def test_a_decision_lost_by_a_crash_may_be_asked_once_more() -> None:
    crash = CrashSnapshot(calls={"plan": 1}, recorded=frozenset())
    problems, reasked = check_decisions(
        {"plan": 1, "msg": 1}, [crash], {"plan": 2, "msg": 1}, finished=True
    )
    assert (problems, reasked) == ([], ("plan",))


def test_a_recorded_decision_is_never_asked_again() -> None:
    crash = CrashSnapshot(calls={"plan": 1}, recorded=frozenset({"plan"}))
    problems, _ = check_decisions(
        {"plan": 1, "msg": 1}, [crash], {"plan": 2, "msg": 1}, finished=True
    )
    assert problems[0] == (
        "decision 'plan' was recorded before crash 1 and asked 1 more time(s) on resume"
    )
    assert "decision 'plan' asked 2x, the reference 1x" in problems[1]


def test_two_crashes_may_each_lose_the_answer() -> None:
    crashes = [
        CrashSnapshot(calls={"plan": 1}, recorded=frozenset()),
        CrashSnapshot(calls={"plan": 2}, recorded=frozenset()),
    ]
    problems, reasked = check_decisions({"plan": 1}, crashes, {"plan": 3}, finished=True)
    assert (problems, reasked) == ([], ("plan",))
    problems, _ = check_decisions({"plan": 1}, crashes, {"plan": 4}, finished=True)
    assert problems == ["decision 'plan' asked 4x, the reference 1x (2 lost answer(s) allow 3)"]


def test_a_decision_skipped_by_a_finished_run() -> None:
    problems, _ = check_decisions({"plan": 1, "msg": 1}, [], {"plan": 1}, finished=True)
    assert problems == ["decision 'msg' asked 0x, the reference 1x"]
    assert check_decisions({"plan": 1, "msg": 1}, [], {"plan": 1}, finished=False) == ([], ())
