"""Budgets are enforced, not only counted: a run that reaches a limit stops cleanly in
``stopped`` before new work, stays stopped until an operator raises the limit (a
journaled decision), and then continues without repeating anything."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.guards.budget import parse_raises

from ._support import LedgerFactory


class Ledgers:
    """New Ledger objects (as restarted processes would open) that know the workflows."""

    def __init__(self, open_ledger: LedgerFactory) -> None:
        self._open = open_ledger
        self._flows: list[cp.Workflow[Any]] = []

    def register(self, *flows: cp.Workflow[Any]) -> None:
        self._flows.extend(flows)

    def __call__(self, **kw: Any) -> cp.Ledger:
        ledger = self._open(**kw)
        for flow in self._flows:
            ledger.register(flow)
        return ledger


@pytest.fixture
def ledgers(open_ledger: LedgerFactory) -> Ledgers:
    return Ledgers(open_ledger)


def steps_flow(calls: Counter[str], n: int = 5) -> cp.Workflow[list[int]]:
    def work(i: int) -> int:
        calls[f"s{i}"] += 1
        return i

    @cp.workflow("steps")
    def flow(ctx: cp.Context) -> list[int]:
        return [ctx.step(f"s{i}", work, i) for i in range(n)]

    return flow


def decisions_flow(
    calls: Counter[str], *, n: int = 4, tokens: int = 60, cost: float = 0.1
) -> cp.Workflow[list[str]]:
    def ask(i: int) -> cp.Decision:
        calls[f"d{i}"] += 1
        return cp.Decision(f"answer {i}", model="m", usage={"total_tokens": tokens}, cost=cost)

    def note(text: str) -> str:
        calls["note"] += 1
        return text.upper()

    @cp.workflow("decisions")
    def flow(ctx: cp.Context) -> list[str]:
        answers = [ctx.decide(f"d{i}", ask, i) for i in range(n)]
        return [*answers, ctx.step("note", note, "done")]

    return flow


def limits(**kw: Any) -> cp.RunOptions:
    return cp.RunOptions(limits=cp.Limits(**kw))


def journal_types(ledger: cp.Ledger, run_id: str) -> list[str]:
    return [e.type.value for e in ledger._store.load_events(run_id)]


def test_steps_limit_stops_before_the_next_step_then_raise_resumes(
    ledgers: Ledgers,
) -> None:
    calls: Counter[str] = Counter()
    flow = steps_flow(calls)
    ledgers.register(flow)
    with pytest.raises(cp.RunStopped) as stopped:
        ledgers().run(flow, run_id="r", options=limits(max_steps=3))
    assert stopped.value.reason == "budget:steps"
    assert stopped.value.budget == cp.Budget(steps=3)
    assert stopped.value.limits == cp.Limits(max_steps=3)
    assert "--raise-budget steps=" in str(stopped.value)
    assert calls == Counter(s0=1, s1=1, s2=1)  # nothing past the limit

    info = ledgers().get_run("r")
    assert info.status is cp.RunStatus.STOPPED
    assert info.reason == "budget:steps"
    assert info.limits == cp.Limits(max_steps=3)
    assert info.evidence is not None
    assert info.evidence["next_step"] == "s3"
    assert info.evidence["limit"] == {"kind": "steps", "limit": 3, "used": 3}

    # Resuming without raising: still stopped, nothing runs, nothing is written.
    before = journal_types(ledgers(), "r")
    with pytest.raises(cp.RunStopped, match="budget:steps"):
        ledgers().resume("r")
    with pytest.raises(cp.RunStopped):
        ledgers().run(flow, run_id="r", options=limits(max_steps=3))
    assert journal_types(ledgers(), "r") == before
    assert sum(calls.values()) == 3

    result = ledgers().resume("r", raise_budget={"steps": 10}, by="alice")
    assert result == [0, 1, 2, 3, 4]
    assert calls == Counter({f"s{i}": 1 for i in range(5)})  # each body exactly once
    info = ledgers().get_run("r")
    assert info.status is cp.RunStatus.SUCCEEDED
    assert info.limits == cp.Limits(max_steps=10)
    assert info.to_json()["limits"]["steps"] == 10
    events = ledgers()._store.load_events("r")
    raised = [e for e in events if e.type is EventType.BUDGET_RAISED]
    assert len(raised) == 1
    payload = raised[0].payload
    assert payload["by"] == "alice"
    assert payload["host"]
    assert payload["old"]["steps"] == 3
    assert payload["new"]["steps"] == 10
    assert payload["changed"] == {"steps": [3, 10]}
    # The raise, then the thaw, then only the two steps that had not run.
    after = [e.type.value for e in events[raised[0].seq :]]
    assert after == ["budget_raised", "run_thawed", "step_done", "step_done", "run_succeeded"]


def test_the_operator_defaults_to_the_os_user(ledgers: Ledgers) -> None:
    import getpass

    calls: Counter[str] = Counter()
    ledgers.register(flow := steps_flow(calls, 2))
    with pytest.raises(cp.RunStopped):
        ledgers().run(flow, run_id="r", options=limits(max_steps=1))
    ledgers().resume("r", raise_budget={"steps": None})  # None lifts the limit
    events = ledgers()._store.load_events("r")
    event = next(e for e in events if e.type is EventType.BUDGET_RAISED)
    assert event.payload["by"] == getpass.getuser()
    assert event.payload["new"]["steps"] is None
    assert ledgers().get_run("r").status is cp.RunStatus.SUCCEEDED


def test_decisions_limit(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()
    flow = decisions_flow(calls, tokens=1)
    ledgers.register(flow)
    with pytest.raises(cp.RunStopped) as stopped:
        ledgers().run(flow, run_id="r", options=limits(max_decisions=2))
    assert stopped.value.reason == "budget:decisions"
    assert calls == Counter(d0=1, d1=1)
    assert ledgers().resume("r", raise_budget={"decisions": 4})[-1] == "DONE"
    assert calls == Counter(d0=1, d1=1, d2=1, d3=1, note=1)


def test_tokens_limit_stops_after_the_decision_that_crossed_it(
    ledgers: Ledgers,
) -> None:
    calls: Counter[str] = Counter()
    flow = decisions_flow(calls, tokens=60)
    ledgers.register(flow)
    with pytest.raises(cp.RunStopped) as stopped:
        ledgers().run(flow, run_id="r", options=limits(max_tokens=100))
    assert stopped.value.reason == "budget:tokens"
    # The second decision crossed 100; its tokens are spent, so it completes and counts.
    assert stopped.value.budget.tokens == 120
    assert calls == Counter(d0=1, d1=1)
    info = ledgers().get_run("r")
    assert info.reason == "budget:tokens"
    assert info.budget.tokens == 120

    # Raised, but not enough: runs one more decision and stops again, journaled twice.
    with pytest.raises(cp.RunStopped, match="budget:tokens"):
        ledgers().resume("r", raise_budget={"tokens": 150})
    assert calls == Counter(d0=1, d1=1, d2=1)
    assert ledgers().resume("r", raise_budget={"tokens": 5000})[-1] == "DONE"
    assert calls == Counter(d0=1, d1=1, d2=1, d3=1, note=1)
    types = journal_types(ledgers(), "r")
    assert types.count("run_stopped") == 2
    assert types.count("budget_raised") == 2


def test_out_of_tokens_local_work_goes_on_but_no_decision_starts(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()

    def ask(q: str) -> cp.Decision:
        calls[q] += 1
        return cp.Decision(q, usage={"input_tokens": 90, "output_tokens": 30})

    def local() -> int:
        calls["local"] += 1
        return 1

    @cp.workflow("mixed")
    def flow(ctx: cp.Context) -> list[Any]:
        return [
            ctx.decide("plan", ask, "plan"),
            ctx.step("apply", local),
            ctx.decide("check", ask, "check"),
        ]

    ledgers.register(flow)
    with pytest.raises(cp.RunStopped, match="budget:tokens") as stopped:
        ledgers().run(flow, run_id="r", options=limits(max_tokens=100, max_steps=10))
    assert calls == Counter(plan=1, local=1)  # tokens gate decisions, not local steps
    assert stopped.value.budget == cp.Budget(steps=2, decisions=1, tokens=120)
    info = ledgers().get_run("r")
    assert info.evidence is not None
    assert (info.evidence["next_step"], info.evidence["next_kind"]) == ("check", "decide")


def test_cost_limit(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()
    flow = decisions_flow(calls, tokens=0, cost=0.1)
    ledgers.register(flow)
    with pytest.raises(cp.RunStopped) as stopped:
        ledgers().run(flow, run_id="r", options=limits(max_cost=0.3))
    # 0.1 + 0.1 + 0.1 is 0.30000000000000004 in floats, and 0.3 in any budget.
    assert stopped.value.reason == "budget:cost"
    assert calls == Counter(d0=1, d1=1, d2=1)
    assert ledgers().resume("r", raise_budget={"cost": 1.0})[-1] == "DONE"
    assert calls["d3"] == 1


def test_wall_time_counts_from_the_first_start(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()

    def slow() -> str:
        calls["slow"] += 1
        time.sleep(0.6)
        return "slow"

    def fast() -> str:
        calls["fast"] += 1
        return "fast"

    # A limit a loaded machine cannot reach before the first step (0.05 s once did).
    @cp.workflow("timed")
    def flow(ctx: cp.Context) -> list[str]:
        return [ctx.step("slow", slow), ctx.step("fast", fast)]

    ledgers.register(flow)
    with pytest.raises(cp.RunStopped) as stopped:
        ledgers().run(flow, run_id="r", options=limits(max_wall_seconds=0.5))
    assert stopped.value.reason == "budget:wall_time"
    assert stopped.value.wall_seconds >= 0.5
    assert calls == Counter(slow=1)  # the step in progress was not cut; the next never ran
    # Still out of time on resume (the clock kept running while nothing drove the run).
    with pytest.raises(cp.RunStopped, match="wall_time"):
        ledgers().resume("r")
    assert ledgers().resume("r", raise_budget={"wall_time": 60}) == ["slow", "fast"]
    assert calls == Counter(slow=1, fast=1)


def test_a_run_that_ends_exactly_at_its_limit_succeeds_and_replays(
    ledgers: Ledgers,
) -> None:
    calls: Counter[str] = Counter()
    flow = steps_flow(calls, 3)
    ledgers.register(flow)
    points = cp.CrashPoints(match="before_commit[run_succeeded]")
    with pytest.raises(cp.SimulatedCrash):
        ledgers(crash_points=points).run(flow, run_id="r", options=limits(max_steps=3))
    # Replayed steps are never checked against the limit: only new work is.
    assert ledgers().run(flow, run_id="r", options=limits(max_steps=3)) == [0, 1, 2]
    assert calls == Counter(s0=1, s1=1, s2=1)
    assert ledgers().get_run("r").status is cp.RunStatus.SUCCEEDED


@pytest.mark.parametrize("side", ["before_commit", "after_commit"])
def test_a_crash_at_the_stop_resumes_to_the_same_stopped_state(ledgers: Ledgers, side: str) -> None:
    calls: Counter[str] = Counter()
    flow = steps_flow(calls)
    ledgers.register(flow)
    points = cp.CrashPoints(match=f"{side}[run_stopped:s2]")
    with pytest.raises(cp.SimulatedCrash):
        ledgers(crash_points=points).run(flow, run_id="r", options=limits(max_steps=2))
    with pytest.raises(cp.RunStopped, match="budget:steps"):
        ledgers().resume("r")
    assert calls == Counter(s0=1, s1=1)
    info = ledgers().get_run("r")
    assert (info.status, info.reason) == (cp.RunStatus.STOPPED, "budget:steps")
    assert journal_types(ledgers(), "r").count("run_stopped") == 1


def test_a_crash_after_the_last_allowed_step_stops_on_resume(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()
    flow = steps_flow(calls)
    ledgers.register(flow)
    points = cp.CrashPoints(match="after_commit[step_done:s1]")
    with pytest.raises(cp.SimulatedCrash):
        ledgers(crash_points=points).run(flow, run_id="r", options=limits(max_steps=2))
    with pytest.raises(cp.RunStopped):
        ledgers().resume("r")
    assert calls == Counter(s0=1, s1=1)


def test_a_crash_after_the_raise_is_committed_continues(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()
    flow = steps_flow(calls, 3)
    ledgers.register(flow)
    with pytest.raises(cp.RunStopped):
        ledgers().run(flow, run_id="r", options=limits(max_steps=1))
    points = cp.CrashPoints(match="after_commit[budget_raised]")
    with pytest.raises(cp.SimulatedCrash):
        ledgers(crash_points=points).resume("r", raise_budget={"steps": 3})
    # The same command again: the raise is already journaled, so nothing more is.
    assert ledgers().resume("r", raise_budget={"steps": 3}) == [0, 1, 2]
    assert journal_types(ledgers(), "r").count("budget_raised") == 1
    assert calls == Counter(s0=1, s1=1, s2=1)


def test_a_workflow_that_swallows_the_stop_stays_stopped(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()

    def work() -> int:
        calls["work"] += 1
        return 1

    @cp.workflow("swallow")
    def flow(ctx: cp.Context) -> str:
        ctx.step("a", work)
        with contextlib.suppress(cp.CrashproofError):
            ctx.step("b", work)
        try:
            ctx.step("c", work)
        except cp.RunStopped:
            return "ignored the budget"
        return "ran everything"

    with pytest.raises(cp.RunStopped):
        ledgers().run(flow, run_id="r", options=limits(max_steps=1))
    assert calls["work"] == 1
    assert ledgers().get_run("r").status is cp.RunStatus.STOPPED


def test_limits_are_recorded_and_fixed_at_start(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()
    flow = steps_flow(calls, 2)
    ledgers.register(flow)
    with pytest.raises(cp.RunStopped):
        ledgers().run(flow, run_id="r", options=limits(max_steps=1, max_tokens=10))
    started = ledgers()._store.load_events("r")[0].payload
    assert started["limits"] == {
        "steps": 1, "decisions": None, "tokens": 10, "cost": None, "wall_time": None,
    }  # fmt: skip
    before = journal_types(ledgers(), "r")
    with pytest.raises(cp.CrashproofError, match="Limits are fixed when a run starts"):
        ledgers().run(flow, run_id="r", options=limits(max_steps=99))
    assert journal_types(ledgers(), "r") == before
    # Without options, run() resumes under the recorded limits.
    with pytest.raises(cp.RunStopped):
        ledgers().run(flow, run_id="r")


def test_a_raise_never_lowers_and_bad_raises_write_nothing(ledgers: Ledgers) -> None:
    calls: Counter[str] = Counter()
    flow = steps_flow(calls, 3)
    ledgers.register(flow)
    with pytest.raises(cp.RunStopped):
        ledgers().run(flow, run_id="r", options=limits(max_steps=2))
    before = journal_types(ledgers(), "r")
    with pytest.raises(ValueError, match="would lower"):
        ledgers().resume("r", raise_budget={"steps": 1})
    with pytest.raises(ValueError, match="would lower"):  # unlimited tokens stay unlimited
        ledgers().resume("r", raise_budget={"tokens": 100})
    with pytest.raises(ValueError, match="unknown budget kind"):
        ledgers().resume("r", raise_budget={"minutes": 5})
    with pytest.raises(ValueError, match="non-negative integer"):
        ledgers().resume("r", raise_budget={"steps": 2.5})
    with pytest.raises(ValueError, match="by="):
        ledgers().resume("r", raise_budget={"steps": 5}, by=" ")
    # The same limit again changes nothing (a retried command is safe).
    with pytest.raises(cp.RunStopped):
        ledgers().resume("r", raise_budget={"steps": 2})
    assert journal_types(ledgers(), "r") == before
    assert sum(calls.values()) == 2


def test_an_ended_run_takes_no_raise(ledgers: Ledgers) -> None:
    flow = steps_flow(Counter(), 1)
    ledgers.register(flow)
    ledgers().run(flow, run_id="r", options=limits(max_steps=5))
    with pytest.raises(cp.CrashproofError, match="has ended"):
        ledgers().resume("r", raise_budget={"steps": 10})
    assert ledgers().resume("r") == [0]


def test_runs_without_limits_record_nothing(ledgers: Ledgers) -> None:
    ledgers().run(steps_flow(Counter(), 1), run_id="r")
    started = ledgers()._store.load_events("r")[0].payload
    assert "limits" not in started
    assert "policy" not in started
    info = ledgers().get_run("r")
    assert info.limits is None
    assert info.policy is None


def test_ctx_time_and_randomness_are_not_metered(ledgers: Ledgers) -> None:
    @cp.workflow("clock")
    def flow(ctx: cp.Context) -> str:
        ctx.step("only", lambda: 1)
        ctx.now()
        ctx.uuid()
        return "done"

    assert ledgers().run(flow, run_id="r", options=limits(max_steps=1)) == "done"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_steps": -1}, "max_steps must be a non-negative integer"),
        ({"max_steps": True}, "max_steps must be a non-negative integer"),
        ({"max_tokens": 1.5}, "max_tokens must be a non-negative integer"),
        ({"max_cost": float("nan")}, "max_cost must be a non-negative number"),
        ({"max_wall_seconds": "60"}, "max_wall_seconds must be a non-negative number"),
    ],
)
def test_limits_validate(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cp.Limits(**kw)


def test_parse_raises() -> None:
    assert parse_raises(["tokens=5000", "cost=2.5", "wall-time=none"]) == {
        "tokens": 5000,
        "cost": 2.5,
        "wall_time": None,
    }
    bad = {
        "tokens": "is not KIND=VALUE",
        "minutes=5": "is not KIND=VALUE",
        "tokens=lots": "not a number",
        "cost=-1": "must be a non-negative number",
    }
    for pair, message in bad.items():
        with pytest.raises(ValueError, match=message):
            parse_raises([pair])
    with pytest.raises(ValueError, match="given twice"):
        parse_raises(["steps=1", "steps=2"])
