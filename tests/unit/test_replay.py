"""Recording and replay of steps, decisions, time, randomness, ids and patches."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from typing import Any

import pytest

import crashproof as cp

from ._support import FINISH, LedgerFactory

# -- steps and decisions -----------------------------------------------------


def make_agent(calls: Counter[str]) -> cp.Workflow[Any]:
    def fetch(repo: str) -> dict[str, Any]:
        calls["fetch"] += 1
        return {"repo": repo, "files": 3}

    def plan(state: dict[str, Any]) -> cp.Decision:
        calls["plan"] += 1
        return cp.Decision(
            f"edit {state['files']} files",
            model="model-a",
            usage={"input_tokens": 100, "output_tokens": 20},
            cost=0.25,
        )

    def review(text: str) -> cp.Decision:
        calls["review"] += 1
        return cp.Decision("approve", model="model-b", usage={"total_tokens": 7}, cost=0.5)

    def apply(text: str) -> str:
        calls["apply"] += 1
        return text.upper()

    @cp.workflow("agent")
    def agent(ctx: cp.Context, repo: str) -> dict[str, Any]:
        state = ctx.step("fetch", fetch, repo)
        proposal = ctx.decide("plan", plan, state)
        verdict = ctx.decide("review", review, proposal)
        done = ctx.step("apply", apply, proposal)
        return {"verdict": verdict, "done": done}

    return agent


EXPECTED = {"verdict": "approve", "done": "EDIT 3 FILES"}


def test_first_run_executes_each_call_once(open_ledger: LedgerFactory) -> None:
    calls: Counter[str] = Counter()
    ledger = open_ledger()
    assert ledger.run(make_agent(calls), run_id="r1", repo="x") == EXPECTED
    assert calls == {"fetch": 1, "plan": 1, "review": 1, "apply": 1}


def test_resume_with_a_fresh_ledger_runs_no_body_and_asks_no_decision(
    open_ledger: LedgerFactory,
) -> None:
    calls: Counter[str] = Counter()
    agent = make_agent(calls)
    with pytest.raises(cp.SimulatedCrash):
        open_ledger(crash_points=cp.CrashPoints(match=FINISH)).run(agent, run_id="r1", repo="x")
    assert calls == {"fetch": 1, "plan": 1, "review": 1, "apply": 1}

    fresh = open_ledger()
    fresh.register(agent)
    assert fresh.resume("r1") == EXPECTED
    assert calls == {"fetch": 1, "plan": 1, "review": 1, "apply": 1}
    assert fresh.get_run("r1").status is cp.RunStatus.SUCCEEDED


def test_a_finished_run_is_returned_without_running_anything(open_ledger: LedgerFactory) -> None:
    calls: Counter[str] = Counter()
    agent = make_agent(calls)
    open_ledger().run(agent, run_id="r1", repo="x")
    again = open_ledger()
    assert again.run(agent, run_id="r1", repo="x") == EXPECTED
    assert again.resume("r1") == EXPECTED
    assert sum(calls.values()) == 4


def test_decisions_show_in_budget_and_step_infos(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()
    ledger.run(make_agent(Counter()), run_id="r1", repo="x")

    info = open_ledger().get_run("r1")
    assert info.budget == cp.Budget(steps=4, decisions=2, tokens=127, cost=0.75)
    steps = {s.key: s for s in info.steps}
    assert list(steps) == ["fetch", "plan", "review", "apply"]
    plan = steps["plan"]
    assert (plan.kind, plan.status, plan.attempts) == (
        cp.StepKind.DECIDE,
        cp.StepStatus.SUCCEEDED,
        1,
    )
    assert (plan.model, plan.usage, plan.cost) == (
        "model-a",
        {"input_tokens": 100, "output_tokens": 20},
        0.25,
    )
    assert steps["review"].model == "model-b"
    fetch = steps["fetch"]
    assert fetch.kind is cp.StepKind.STEP
    assert (fetch.model, fetch.usage, fetch.cost) == (None, None, None)
    assert fetch.duration is not None
    assert fetch.duration >= 0


def test_budget_survives_a_crash_and_counts_each_decision_once(
    open_ledger: LedgerFactory,
) -> None:
    agent = make_agent(Counter())
    crashing = open_ledger(crash_points=cp.CrashPoints(match="after_commit[step_done:review]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(agent, run_id="r1", repo="x")
    assert open_ledger().get_run("r1").budget == cp.Budget(
        steps=3, decisions=2, tokens=127, cost=0.75
    )
    fresh = open_ledger()
    fresh.run(agent, run_id="r1", repo="x")
    assert fresh.get_run("r1").budget == cp.Budget(steps=4, decisions=2, tokens=127, cost=0.75)


def test_a_plain_decide_value_is_recorded_without_model_info(open_ledger: LedgerFactory) -> None:
    @cp.workflow("plain")
    def plain(ctx: cp.Context) -> Any:
        return ctx.decide("choose", lambda: {"pick": 2})

    ledger = open_ledger()
    assert ledger.run(plain, run_id="r1") == {"pick": 2}
    step = ledger.get_run("r1").steps[0]
    assert (step.kind, step.model, step.cost) == (cp.StepKind.DECIDE, None, None)
    assert ledger.get_run("r1").budget == cp.Budget(steps=1, decisions=1, tokens=0, cost=0.0)


def test_repeated_names_get_numbered_keys_and_replay_by_key(open_ledger: LedgerFactory) -> None:
    calls: list[int] = []

    def turn(i: int) -> str:
        calls.append(i)
        return f"turn {i}"

    @cp.workflow("loop")
    def loop(ctx: cp.Context) -> list[str]:
        out = [ctx.step("turn", turn, i) for i in range(3)]
        out.append(ctx.step("other", turn, 9))
        out.append(ctx.step("turn", turn, 3))
        return out

    expected = ["turn 0", "turn 1", "turn 2", "turn 9", "turn 3"]
    with pytest.raises(cp.SimulatedCrash):
        open_ledger(crash_points=cp.CrashPoints(match=FINISH)).run(loop, run_id="r1")
    fresh = open_ledger()
    assert fresh.run(loop, run_id="r1") == expected
    assert calls == [0, 1, 2, 9, 3]
    keys = [s.key for s in fresh.get_run("r1").steps]
    assert keys == ["turn", "turn#2", "turn#3", "other", "turn#4"]


# -- time, randomness, ids ---------------------------------------------------


def test_now_random_uuid_return_the_same_values_on_replay(open_ledger: LedgerFactory) -> None:
    seen: list[tuple[Any, ...]] = []

    @cp.workflow("clock")
    def clock(ctx: cp.Context) -> str:
        values = (ctx.now(), ctx.random(), ctx.uuid(), ctx.now(), ctx.random(), ctx.uuid())
        seen.append(values)
        return "done"

    with pytest.raises(cp.SimulatedCrash):
        open_ledger(crash_points=cp.CrashPoints(match=FINISH)).run(clock, run_id="r1")
    fresh = open_ledger()
    fresh.run(clock, run_id="r1")

    first, replayed = seen
    assert replayed == first
    now1, rand1, id1, now2, rand2, id2 = first
    assert isinstance(now1, dt.datetime)
    assert now1.tzinfo is not None
    assert now1 <= now2
    assert 0.0 <= rand1 < 1.0
    assert rand1 != rand2
    assert isinstance(id1, uuid.UUID)
    assert id1.version == 4
    assert id1 != id2
    info = fresh.get_run("r1")
    assert [s.key for s in info.steps] == ["now", "random", "uuid", "now#2", "random#2", "uuid#2"]
    assert [s.kind for s in info.steps[:3]] == [
        cp.StepKind.NOW,
        cp.StepKind.RANDOM,
        cp.StepKind.UUID,
    ]
    # Reading the clock is not work: it does not count in the budget.
    assert info.budget.steps == 0


# -- patched -----------------------------------------------------------------


def _old_code(calls: Counter[str]) -> cp.Workflow[Any]:
    @cp.workflow("evolving")
    def evolving(ctx: cp.Context) -> list[str]:
        a = ctx.step("a", lambda: calls.update(["a"]) or "a")
        b = ctx.step("old-b", lambda: calls.update(["old-b"]) or "old-b")
        c = ctx.step("c", lambda: calls.update(["c"]) or "c")
        return [a, b, c]

    return evolving


def _new_code(calls: Counter[str], answers: list[bool]) -> cp.Workflow[Any]:
    @cp.workflow("evolving")
    def evolving(ctx: cp.Context) -> list[str]:
        a = ctx.step("a", lambda: calls.update(["a"]) or "a")
        answers.append(ctx.patched("new-b"))
        if answers[-1]:
            b = ctx.step("new-b", lambda: calls.update(["new-b"]) or "new-b")
        else:
            b = ctx.step("old-b", lambda: calls.update(["old-b"]) or "old-b")
        answers.append(ctx.patched("new-b"))  # asked twice: the same answer
        c = ctx.step("c", lambda: calls.update(["c"]) or "c")
        return [a, b, c]

    return evolving


def test_patched_is_true_for_a_new_run_and_recorded(open_ledger: LedgerFactory) -> None:
    calls: Counter[str] = Counter()
    answers: list[bool] = []
    new = _new_code(calls, answers)
    with pytest.raises(cp.SimulatedCrash):
        open_ledger(crash_points=cp.CrashPoints(match=FINISH)).run(new, run_id="r1")
    fresh = open_ledger()
    assert fresh.run(new, run_id="r1") == ["a", "new-b", "c"]
    assert answers == [True, True, True, True]
    assert calls == {"a": 1, "new-b": 1, "c": 1}
    steps = fresh.get_run("r1").steps
    assert [(s.key, s.kind) for s in steps] == [
        ("a", cp.StepKind.STEP),
        ("patched:new-b", cp.StepKind.PATCHED),
        ("new-b", cp.StepKind.STEP),
        ("c", cp.StepKind.STEP),
    ]


def test_patched_is_false_for_a_run_that_passed_the_point_before_the_patch(
    open_ledger: LedgerFactory,
) -> None:
    calls: Counter[str] = Counter()
    crashing = open_ledger(crash_points=cp.CrashPoints(match="after_commit[step_done:old-b]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(_old_code(calls), run_id="r1")
    assert calls == {"a": 1, "old-b": 1}

    answers: list[bool] = []
    fresh = open_ledger()
    assert fresh.run(_new_code(calls, answers), run_id="r1") == ["a", "old-b", "c"]
    assert answers == [False, False]
    assert calls == {"a": 1, "old-b": 1, "c": 1}
    info = fresh.get_run("r1")
    assert info.status is cp.RunStatus.SUCCEEDED
    assert [s.key for s in info.steps] == ["a", "old-b", "c"]


def test_patched_is_true_for_an_old_run_that_had_not_reached_the_point(
    open_ledger: LedgerFactory,
) -> None:
    calls: Counter[str] = Counter()
    crashing = open_ledger(crash_points=cp.CrashPoints(match="after_commit[step_done:a]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(_old_code(calls), run_id="r1")
    answers: list[bool] = []
    assert open_ledger().run(_new_code(calls, answers), run_id="r1") == ["a", "new-b", "c"]
    assert answers == [True, True]
    assert calls == {"a": 1, "new-b": 1, "c": 1}


@pytest.mark.parametrize("name", ["turn#2", "", "#"])
def test_a_name_that_could_collide_with_a_numbered_key_is_refused(
    open_ledger: LedgerFactory, name: str
) -> None:
    calls: Counter[str] = Counter()

    @cp.workflow("names")
    def names(ctx: cp.Context) -> list[str]:
        return [ctx.step(name, lambda: calls.update([name]) or "x")]

    ledger = open_ledger()
    with pytest.raises(cp.CrashproofError, match="'#'"):
        ledger.run(names, run_id="r1")
    assert calls == {}
    info = ledger.get_run("r1")
    assert (info.status, info.steps) == (cp.RunStatus.RUNNING, ())
