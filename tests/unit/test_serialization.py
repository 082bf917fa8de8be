"""Values cross the journal as JSON: the workflow sees the same thing live and on replay,
and anything that is not JSON is refused before it is recorded."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crashproof as cp
from crashproof.store.memory import MemoryStore

from ._support import FINISH, LedgerFactory


def test_results_are_json_round_tripped_on_the_first_run_too(open_ledger: LedgerFactory) -> None:
    seen: list[Any] = []

    @cp.workflow("shapes")
    def shapes(ctx: cp.Context) -> Any:
        pair = ctx.step("pair", lambda: (1, "two"))
        nested = ctx.step("nested", lambda: {"k": (1, (2, 3))})
        seen.append((pair, nested))
        return (pair, nested)

    with pytest.raises(cp.SimulatedCrash):
        open_ledger(crash_points=cp.CrashPoints(match=FINISH)).run(shapes, run_id="r1")
    result = open_ledger().run(shapes, run_id="r1")

    live, replayed = seen
    assert live == replayed == ([1, "two"], {"k": [1, [2, 3]]})
    assert type(live[0]) is list
    assert type(replayed[0]) is list
    assert result == [[1, "two"], {"k": [1, [2, 3]]}]
    assert open_ledger().run(shapes, run_id="r1") == result


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({1, 2}, id="set"),
        pytest.param(Opaque(), id="object"),
        pytest.param({"nan": math.nan}, id="nan"),
        pytest.param(b"bytes", id="bytes"),
        pytest.param({("tuple", "key"): 1}, id="tuple-key"),
    ],
)
def test_a_non_json_result_records_nothing_and_the_run_stays_resumable(
    open_ledger: LedgerFactory, bad: Any
) -> None:
    calls: Counter[str] = Counter()

    def make(result: Any) -> cp.Workflow[Any]:
        @cp.workflow("leaky")
        def leaky(ctx: cp.Context) -> Any:
            first = ctx.step("first", lambda: calls.update(["first"]) or 1)
            second = ctx.step("compute", lambda: calls.update(["compute"]) or result)
            return [first, second]

        return leaky

    ledger = open_ledger()
    with pytest.raises(cp.SerializationError, match="'compute'") as caught:
        ledger.run(make(bad), run_id="r1")
    assert isinstance(caught.value, TypeError)
    info = ledger.get_run("r1")
    assert info.status is cp.RunStatus.RUNNING
    assert [s.key for s in info.steps] == ["first"]

    # The code is fixed; the run resumes where it stopped.
    fixed = open_ledger()
    assert fixed.run(make("fixed"), run_id="r1") == [1, "fixed"]
    assert calls == {"first": 1, "compute": 2}
    assert fixed.get_run("r1").status is cp.RunStatus.SUCCEEDED


def test_a_non_json_argument_is_refused_before_the_step_runs(open_ledger: LedgerFactory) -> None:
    calls: list[Any] = []

    @cp.workflow("args")
    def args(ctx: cp.Context) -> Any:
        return ctx.step("use", calls.append, {"a", "b"})

    ledger = open_ledger()
    with pytest.raises(cp.SerializationError, match="'use'"):
        ledger.run(args, run_id="r1")
    assert calls == []
    info = ledger.get_run("r1")
    assert info.status is cp.RunStatus.RUNNING
    assert info.steps == ()


def test_an_integer_json_cannot_hold_exactly_is_refused_as_an_argument(
    open_ledger: LedgerFactory,
) -> None:
    @cp.workflow("bigint")
    def bigint(ctx: cp.Context) -> Any:
        return ctx.step("use", lambda n: n, n=2**60)

    with pytest.raises(cp.SerializationError, match="'use'"):
        open_ledger().run(bigint, run_id="r1")


def test_a_non_json_workflow_result_keeps_the_run_resumable(open_ledger: LedgerFactory) -> None:
    @cp.workflow("result")
    def result(ctx: cp.Context) -> Any:
        return {ctx.step("one", lambda: 1)}

    ledger = open_ledger()
    with pytest.raises(cp.SerializationError, match="'r1'"):
        ledger.run(result, run_id="r1")
    assert ledger.get_run("r1").status is cp.RunStatus.RUNNING


def test_a_non_json_decision_usage_records_nothing(open_ledger: LedgerFactory) -> None:
    @cp.workflow("usage")
    def usage(ctx: cp.Context) -> Any:
        return ctx.decide("ask", lambda: cp.Decision("yes", usage={"tokens": {1, 2}}))  # type: ignore[dict-item]

    ledger = open_ledger()
    with pytest.raises(cp.SerializationError, match="'ask'"):
        ledger.run(usage, run_id="r1")
    assert ledger.get_run("r1").steps == ()


def test_a_non_json_run_input_creates_no_run(open_ledger: LedgerFactory) -> None:
    @cp.workflow("input")
    def takes(ctx: cp.Context, item: Any) -> Any:
        return item

    ledger = open_ledger()
    with pytest.raises(cp.SerializationError):
        ledger.run(takes, run_id="r1", item={1, 2})
    assert ledger.runs() == []


def test_lone_surrogates_round_trip(open_ledger: LedgerFactory) -> None:
    # File names decoded with surrogateescape hold lone surrogates; they are not UTF-8.
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")

    class Boom(Exception):
        pass

    def open_it() -> None:
        raise ValueError(f"cannot open {name}")

    @cp.workflow("surrogates")
    def surrogates(ctx: cp.Context) -> Any:
        listed = ctx.step("list", lambda: [name])
        try:
            ctx.step("open", open_it)
        except ValueError as exc:
            return [listed, str(exc)]
        raise Boom

    expected = [[name], f"cannot open {name}"]
    with pytest.raises(cp.SimulatedCrash):
        open_ledger(crash_points=cp.CrashPoints(match=FINISH)).run(surrogates, run_id="r1")
    fresh = open_ledger()
    assert fresh.run(surrogates, run_id="r1") == expected
    assert open_ledger().get_run("r1").result == expected


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@settings(max_examples=30, deadline=None)
@given(value=JSON)
def test_any_json_value_replays_equal_to_what_the_workflow_saw_live(value: Any) -> None:
    seen: list[Any] = []

    @cp.workflow("echo")
    def echo(ctx: cp.Context) -> Any:
        seen.append(ctx.step("echo", lambda v: v, value))
        return seen[-1]

    store = MemoryStore()
    crashing = cp.Ledger("memory://", store=store, crash_points=cp.CrashPoints(match=FINISH))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(echo, run_id="r")
    assert cp.Ledger("memory://", store=store).run(echo, run_id="r") == value
    assert seen == [value, value]
