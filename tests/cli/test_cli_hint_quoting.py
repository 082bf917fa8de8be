"""Run ids pasted into suggested commands are shell words (#40): a run id comes from outside
input (an issue title, a branch name), and a hint that reads `crashproof show q$(touch x)`
runs `touch` when an operator pastes it. Every id in every hint is `shlex.quote`d."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashproof.cli import ExitCode

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

# A command substitution, a quote and a space: each breaks an unquoted paste differently.
HOSTILE = "q$(touch pwned) it's"

FLOWS = """
import pathlib

import crashproof as cp


def ask():
    if pathlib.Path("down").exists():
        raise cp.Unavailable("503 model overloaded")
    return cp.Decision("plan", model="m")


def test(plan):
    raise ValueError("tests failed")


@cp.workflow("fails", version="1")
def fails(ctx):
    plan = ctx.decide("turn", ask)
    return ctx.step("test", test, plan)


@cp.workflow("outage", version="1")
def outage(ctx):
    return ctx.decide("turn", ask)
"""


@pytest.fixture
def quoting(project: Path) -> Path:
    (project / "quoting.py").write_text(FLOWS, encoding="utf-8")
    return project


def _only_quoted(text: str, run_id: str) -> int:
    """How many quoted copies of ``run_id`` ``text`` holds; fails where one is bare.

    A copy inside a suggested command is ``shlex.quote(run_id)``; a copy in prose is the
    message's ``repr``. Take both away: nothing of the id may remain."""
    word = shlex.quote(run_id)
    found = text.count(word)
    rest = text.replace(word, "").replace(repr(run_id), "")
    assert run_id not in rest, text
    return found


def _pasted(hint: str, project: Path) -> None:
    """Every backticked command of ``hint`` parsed as a shell would: the id stays one
    literal argument, and running the words through a real shell's ``printf`` runs
    nothing the id holds."""
    commands = hint.split("`")[1::2]
    assert commands, hint
    for command in commands:
        if HOSTILE.split(" ")[0] not in command and shlex.quote(HOSTILE) not in command:
            continue
        assert HOSTILE in shlex.split(command), command
        subprocess.run(["bash", "-c", f"printf '%s\\n' {command}"], cwd=project, check=True)
    assert not (project / "pwned").exists()


def test_a_failed_runs_hints_quote_its_id(quoting: Path, cli: Cli) -> None:
    failed = cli("run", "quoting:fails", "--run-id", HOSTILE)
    assert failed.code == ExitCode.RUN_FAILED, failed.err
    assert _only_quoted(failed.err, HOSTILE) >= 2  # show and retry
    _pasted(failed.err.splitlines()[1], quoting)


def test_a_stopped_runs_hints_quote_its_id(quoting: Path, cli: Cli) -> None:
    (quoting / "down").touch()
    stopped = cli("run", "quoting:outage", "--run-id", HOSTILE)
    assert stopped.code == ExitCode.RUN_INTERRUPTED, stopped.err
    assert _only_quoted(stopped.err, HOSTILE) >= 2  # the library's detail and the hint
    _pasted(stopped.err.splitlines()[1], quoting)
    refused = cli("retry", HOSTILE, "--app", "quoting")  # stopped, not failed: resume it
    assert refused.code == ExitCode.CONFLICT, refused.err
    assert _only_quoted(refused.err, HOSTILE) >= 1


def test_a_refused_cancel_quotes_the_id_in_its_hint(quoting: Path, cli: Cli) -> None:
    assert cli("run", "quoting:outage", "--run-id", HOSTILE).code == ExitCode.OK
    refused = cli("cancel", HOSTILE)  # it succeeded: nothing to cancel
    assert refused.code != ExitCode.OK, refused.err
    assert _only_quoted(refused.err, HOSTILE) >= 1
    _pasted(refused.err, quoting)
