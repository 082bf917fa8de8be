"""Crash at every crash point of a small workflow, resume in a new Ledger object, and
check that the resumed run ends exactly as an uninterrupted one: same result, each
committed step run once, no recorded decision asked again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.store.memory import MemoryStore

STEPS = ("fetch", "plan", "apply", "review")
DECISIONS = {"plan", "review"}


def four_steps(calls: Counter[str]) -> cp.Workflow[Any]:
    def fetch(repo: str) -> dict[str, Any]:
        calls["fetch"] += 1
        return {"repo": repo, "files": ["a.py", "b.py"]}

    def plan(state: dict[str, Any]) -> cp.Decision:
        calls["plan"] += 1
        return cp.Decision(
            [f"edit {f}" for f in state["files"]], model="m", usage={"total_tokens": 5}, cost=0.1
        )

    def apply(edits: list[str]) -> int:
        calls["apply"] += 1
        return len(edits)

    def review(count: int) -> str:
        calls["review"] += 1
        return f"approved {count} edits"

    @cp.workflow("four-steps")
    def workflow(ctx: cp.Context, repo: str) -> dict[str, Any]:
        state = ctx.step("fetch", fetch, repo)
        edits = ctx.decide("plan", plan, state)
        count = ctx.step("apply", apply, edits)
        verdict = ctx.decide("review", review, count)
        return {"edits": edits, "verdict": verdict}

    return workflow


OpenLedger = Callable[..., cp.Ledger]


def _sqlite(tmp_path: Path) -> OpenLedger:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    return lambda **kw: cp.Ledger(url, **kw)


def _memory(_tmp_path: Path) -> OpenLedger:
    store = MemoryStore()  # shared: it outlives the "process" like a file would
    return lambda **kw: cp.Ledger("memory://", store=store, **kw)


BACKENDS = {"sqlite": _sqlite, "memory": _memory}


def _reference() -> tuple[Any, list[str]]:
    """The uninterrupted run: its result and every crash point it passes."""
    points = cp.CrashPoints()  # never fires, only records
    ledger = cp.Ledger("memory://", crash_points=points)
    result = ledger.run(four_steps(Counter()), run_id="r", repo="x")
    return result, points.passed


REFERENCE_RESULT, POINTS = _reference()


def test_the_crash_points_cover_both_sides_of_every_commit() -> None:
    labels = ["run_started", *(f"step_done:{s}" for s in STEPS), "run_succeeded"]
    expected = [
        f"{side}[{label}]" for label in labels for side in ("before_commit", "after_commit")
    ]
    assert expected == POINTS


def test_the_points_passed_do_not_depend_on_the_store(tmp_path: Path) -> None:
    points = cp.CrashPoints()
    with _sqlite(tmp_path)(crash_points=points) as ledger:
        ledger.run(four_steps(Counter()), run_id="r", repo="x")
    assert points.passed == POINTS
    assert points.fired is None


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("n", range(1, len(POINTS) + 1), ids=POINTS)
def test_crash_at_every_point_then_resume(tmp_path: Path, backend: str, n: int) -> None:
    point = POINTS[n - 1]
    open_ledger = BACKENDS[backend](tmp_path)
    calls: Counter[str] = Counter()
    workflow = four_steps(calls)

    crashing = open_ledger(crash_points=cp.CrashPoints(at=n))
    with pytest.raises(cp.SimulatedCrash) as crash:
        crashing.run(workflow, run_id="r", repo="x")
    assert crash.value.point == point
    before_resume = Counter(calls)

    resumed = open_ledger()  # a new Ledger object: nothing in memory survives
    try:
        assert resumed.run(workflow, run_id="r", repo="x") == REFERENCE_RESULT
        info = resumed.get_run("r")
        assert info.status is cp.RunStatus.SUCCEEDED
        assert [s.key for s in info.steps] == list(STEPS)
        assert info.budget == cp.Budget(steps=4, decisions=2, tokens=5, cost=0.1)
    finally:
        resumed.close()
        crashing.close()

    # Only the body whose commit the crash cut off may run twice; every other body,
    # committed before the crash or run only after it, runs exactly once in all.
    cut_off = point.removeprefix("before_commit[step_done:").removesuffix("]")
    # No decision committed before the crash was asked again after it.
    for decision in DECISIONS:
        if before_resume[decision] == 1 and decision != cut_off:
            assert calls[decision] == 1, f"decision {decision!r} was asked again"
    expected = {step: 2 if step == cut_off else 1 for step in STEPS}
    assert dict(calls) == expected


@pytest.mark.parametrize("n", [1, 2])
def test_a_crash_around_run_creation(tmp_path: Path, n: int) -> None:
    open_ledger = _sqlite(tmp_path)
    calls: Counter[str] = Counter()
    with open_ledger(crash_points=cp.CrashPoints(at=n)) as crashing:
        with pytest.raises(cp.SimulatedCrash):
            crashing.run(four_steps(calls), run_id="r", repo="x")
        assert calls == {}
        if n == 1:  # before the run's first commit: no trace of it
            with pytest.raises(cp.RunNotFound):
                crashing.get_run("r")
        else:  # after it: the run exists, is running, and has done nothing yet
            info = crashing.get_run("r")
            assert (info.status, info.steps) == (cp.RunStatus.RUNNING, ())
