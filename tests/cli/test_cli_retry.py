"""`crashproof retry RUN`: a failed run re-driven under its own id (exit codes, the
journaled operator, nothing recorded executed twice), and the refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashproof.cli import ExitCode

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result
Calls = Callable[[], list[str]]

FIXABLE = """
import pathlib

import crashproof as cp

CALLS = pathlib.Path("calls.log")


def _count(what):
    with CALLS.open("a", encoding="utf-8") as f:
        f.write(what + "\\n")


def ask():
    _count("ask")
    if pathlib.Path("down").exists():
        raise cp.Unavailable("503 model overloaded")
    return cp.Decision("plan", model="m")


def test(plan):
    _count("test")
    if not pathlib.Path("fixed").exists():
        raise ValueError("tests failed")
    return plan + ": green"


@cp.workflow("fixable", version="1")
def fixable(ctx):
    plan = ctx.decide("turn", ask)
    return ctx.step("test", test, plan)
"""


@pytest.fixture
def fixable(project: Path) -> Path:
    (project / "fixable.py").write_text(FIXABLE, encoding="utf-8")
    return project


def test_a_failed_run_hints_at_retry_and_retry_finishes_it_once(
    fixable: Path, cli: Cli, calls: Calls
) -> None:
    failed = cli("run", "fixable:fixable", "--run-id", "f:1")
    assert failed.code == ExitCode.RUN_FAILED
    assert "crashproof retry f:1 --app MODULE" in failed.err.splitlines()[1]
    (fixable / "fixed").touch()
    retried = cli("retry", "f:1", "--app", "fixable", "--by", "alice")
    assert retried.code == ExitCode.OK, retried.err
    assert retried.out.strip() == '"plan: green"'
    assert calls() == ["ask", "test", "test"]  # the decision was not asked again
    timeline = cli("show", "f:1", "--timeline", "--json")
    assert timeline.code == ExitCode.OK
    entries = [e for e in timeline.json()["timeline"] if e["type"] == "run_retried"]
    assert [e["operator"]["by"] for e in entries] == ["alice"]


def test_retry_of_a_run_that_is_not_failed_exits_4_and_changes_nothing(
    fixable: Path, cli: Cli, calls: Calls
) -> None:
    (fixable / "fixed").touch()
    assert cli("run", "fixable:fixable", "--run-id", "f:2").code == ExitCode.OK
    before = cli("show", "f:2", "--json").json()
    refused = cli("retry", "f:2", "--app", "fixable")
    assert refused.code == ExitCode.CONFLICT
    first, hint = refused.err.splitlines()
    assert first == (
        "crashproof: error: run 'f:2' is succeeded, not failed: only a failed run is "
        "retried, and nothing was changed; it succeeded: there is nothing to retry"
    )
    assert hint.startswith("hint: ")
    assert "Traceback" not in refused.err
    assert cli("show", "f:2", "--json").json() == before
    assert calls() == ["ask", "test"]


def test_retry_of_an_unknown_run_exits_2(fixable: Path, cli: Cli) -> None:
    (fixable / "fixed").touch()
    assert cli("run", "fixable:fixable", "--run-id", "f:4").code == ExitCode.OK
    refused = cli("retry", "nope", "--app", "fixable")
    assert refused.code == ExitCode.USAGE
    assert refused.err.startswith("crashproof: error: no run 'nope'")
    assert len(refused.err.splitlines()) == 2


def test_an_outage_stop_exits_6_with_a_resume_hint_and_resume_finishes(
    fixable: Path, cli: Cli, calls: Calls
) -> None:
    (fixable / "down").touch()
    (fixable / "fixed").touch()
    stopped = cli("run", "fixable:fixable", "--run-id", "f:3")
    assert stopped.code == ExitCode.RUN_INTERRUPTED
    first, hint = stopped.err.splitlines()
    assert first.startswith(
        "crashproof: error: run 'f:3' stopped: unavailable:turn: 503 model overloaded"
    )
    assert "crashproof resume f:3 --app MODULE" in hint
    shown = cli("show", "f:3", "--json").json()
    assert (shown["status"], shown["reason"]) == (
        "stopped",
        "unavailable:turn: 503 model overloaded",
    )
    refused = cli("retry", "f:3", "--app", "fixable")
    assert refused.code == ExitCode.CONFLICT
    assert "crashproof resume f:3 --app MODULE" in refused.err
    (fixable / "down").unlink()
    resumed = cli("resume", "f:3", "--app", "fixable")
    assert resumed.code == ExitCode.OK, resumed.err
    assert calls() == ["ask", "ask", "test"]
