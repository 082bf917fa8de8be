"""Workflows, their registration, and what run/resume refuse before touching anything."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

from ._support import LedgerFactory


def _greeter(calls: Counter[str], version: str = "1") -> cp.Workflow[str]:
    @cp.workflow("greet", version=version)
    def greet(ctx: cp.Context, name: str) -> str:
        return ctx.step("hello", lambda: calls.update(["hello"]) or f"hello {name}")

    return greet


def test_two_ledgers_in_one_process_do_not_interfere(tmp_path: Path) -> None:
    with (
        cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}") as a,
        cp.Ledger(f"sqlite:///{tmp_path / 'b.db'}") as b,
    ):

        @a.workflow("only-in-a")
        def in_a(ctx: cp.Context) -> str:
            return ctx.step("s", lambda: "a")

        @b.workflow("only-in-b", version="7")
        def in_b(ctx: cp.Context) -> str:
            return ctx.step("s", lambda: "b")

        assert set(a.workflows) == {"only-in-a"}
        assert set(b.workflows) == {"only-in-b"}
        assert a.run(in_a, run_id="same-id") == "a"
        assert b.run(in_b, run_id="same-id") == "b"
        with pytest.raises(cp.UnknownWorkflow):
            a.run("only-in-b", run_id="other")

        assert [(r.run_id, r.workflow, r.result) for r in a.runs()] == [
            ("same-id", "only-in-a", "a")
        ]
        assert [(r.run_id, r.workflow, r.version) for r in b.runs()] == [
            ("same-id", "only-in-b", "7")
        ]


def test_memory_ledgers_are_separate() -> None:
    a, b = cp.Ledger("memory://"), cp.Ledger("memory://")
    a.run(_greeter(Counter()), run_id="r1", name="x")
    assert [r.run_id for r in a.runs()] == ["r1"]
    assert b.runs() == []


def test_cp_workflow_plus_register_and_run_by_name(open_ledger: LedgerFactory) -> None:
    calls: Counter[str] = Counter()
    greet = _greeter(calls)
    assert (greet.name, greet.version) == ("greet", "1")
    ledger = open_ledger()
    assert ledger.register(greet) is greet
    assert ledger.workflows == {"greet": greet}
    assert ledger.run("greet", run_id="r1", name="ada") == "hello ada"
    info = ledger.get_run("r1")
    assert (info.workflow, info.version, info.input) == ("greet", "1", {"name": "ada"})


def test_ledger_workflow_decorator_registers(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()

    @ledger.workflow("double", version="2")
    def double(ctx: cp.Context, n: int) -> int:
        return n * 2

    assert isinstance(double, cp.Workflow)
    assert ledger.workflows["double"] is double
    assert ledger.run(double, run_id="r1", n=21) == 42
    assert ledger.get_run("r1").version == "2"


def test_registering_another_version_of_a_name_is_refused(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()
    ledger.register(_greeter(Counter(), version="1"))
    with pytest.raises(cp.CrashproofError, match="version"):
        ledger.register(_greeter(Counter(), version="2"))


@pytest.mark.parametrize("reserved", ["run_id", "options"])
def test_reserved_parameter_names_are_refused_at_decoration(reserved: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def bad(ctx, {reserved}, other=1):\n    return 1\n", namespace)
    with pytest.raises(cp.CrashproofError, match=reserved):
        cp.workflow("bad")(namespace["bad"])
    with pytest.raises(cp.CrashproofError, match=reserved):
        cp.Ledger("memory://").workflow("bad")(namespace["bad"])


def test_a_workflow_needs_a_context_parameter() -> None:
    def no_ctx() -> int:
        return 1

    with pytest.raises(cp.CrashproofError, match="ctx"):
        cp.workflow("no-ctx")(no_ctx)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({}, id="missing"),
        pytest.param({"name": "x", "extra": 1}, id="extra"),
        pytest.param({"nme": "x"}, id="misspelt"),
    ],
)
def test_wrong_input_raises_type_error_and_creates_no_run(
    open_ledger: LedgerFactory, kwargs: dict[str, Any]
) -> None:
    calls: Counter[str] = Counter()
    ledger = open_ledger()
    with pytest.raises(TypeError, match="greet"):
        ledger.run(_greeter(calls), run_id="r1", **kwargs)
    assert ledger.runs() == []
    assert calls == {}
    with pytest.raises(cp.RunNotFound):
        ledger.get_run("r1")


def test_resume_of_an_unknown_run(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()
    ledger.register(_greeter(Counter()))
    with pytest.raises(cp.RunNotFound, match="'nope'") as caught:
        ledger.resume("nope")
    assert isinstance(caught.value, KeyError)
    with pytest.raises(cp.RunNotFound):
        ledger.get_run("nope")


def _interrupted(open_ledger: LedgerFactory, calls: Counter[str]) -> dict[str, Any]:
    """A greet run that crashed before its outcome committed; returns its reader view."""
    crashing = open_ledger(crash_points=cp.CrashPoints(match="before_commit[run_succeeded]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(_greeter(calls), run_id="r1", name="ada")
    return open_ledger().get_run("r1").to_json()


def test_resume_of_a_run_whose_workflow_is_not_registered(open_ledger: LedgerFactory) -> None:
    calls: Counter[str] = Counter()
    before = _interrupted(open_ledger, calls)
    ledger = open_ledger()
    ledger.register(cp.workflow("something-else")(lambda ctx: 1))
    with pytest.raises(cp.UnknownWorkflow, match="'greet'") as caught:
        ledger.resume("r1")
    assert "something-else" in str(caught.value)
    assert open_ledger().get_run("r1").to_json() == before
    assert calls == {"hello": 1}


def test_resume_with_another_registered_version_is_refused(open_ledger: LedgerFactory) -> None:
    calls: Counter[str] = Counter()
    before = _interrupted(open_ledger, calls)
    ledger = open_ledger()
    ledger.register(_greeter(calls, version="2"))
    with pytest.raises(cp.UnknownWorkflow, match="version") as caught:
        ledger.resume("r1")
    assert "'1'" in str(caught.value)
    assert "'2'" in str(caught.value)
    with pytest.raises(cp.UnknownWorkflow, match="version"):
        ledger.run("greet", run_id="r1", name="ada")
    assert open_ledger().get_run("r1").to_json() == before
    assert calls == {"hello": 1}

    # The old version still finishes it.
    old = open_ledger()
    old.register(_greeter(calls, version="1"))
    assert old.resume("r1") == "hello ada"
    assert calls == {"hello": 1}


def test_run_refuses_something_that_is_not_a_workflow(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()
    with pytest.raises(TypeError, match="workflow"):
        ledger.run(lambda ctx: 1, run_id="r1")  # type: ignore[arg-type]
    with pytest.raises(cp.UnknownWorkflow):
        ledger.run("never-registered", run_id="r1")
    assert ledger.runs() == []


@pytest.mark.parametrize(
    "url", ["postgres-ish://x", "sqlite://", "sqlite:///", "sqlite:///:memory:", "runs.db"]
)
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="sqlite"):
        cp.Ledger(url)


def test_an_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        cp.Ledger(f"sqlite:///{tmp_path / 'x.db'}", durability="sometimes")
    assert not (tmp_path / "x.db").exists()
