"""Completion evidence through the CLI: an unverified run exits 6 with the reason and a
hint, stays resumable, and completes once the code checks again; `show` and `--json`
carry the evidence."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashproof.cli import ExitCode

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

AGENT = """
import pathlib
import subprocess
import sys

import crashproof as cp

WS = cp.Workspace(pathlib.Path("repo"))
FINAL_CHECK = pathlib.Path("final-check").exists()


def tests():
    done = subprocess.run(
        [sys.executable, "-B", "-c", "from calc import add; assert add(2, 3) == 5"],
        cwd="repo", capture_output=True, text=True,
    )
    return cp.CheckResult(passed=done.returncode == 0, summary=done.stderr[-200:] or "ok")


@cp.workflow("fix", version="1", completion=cp.Completion(require=["tests"]))
def fix(ctx):
    ctx.act("edit", WS, op="write", path="calc.py", content="def add(a, b):\\n    return a + b\\n")
    ctx.check("tests", tests)
    ctx.act("notes", WS, op="write", path="NOTES.md", content="fixed\\n")
    if FINAL_CHECK:
        ctx.check("tests", tests)
    return "fixed"
"""


@pytest.fixture
def agent(project: Path) -> Path:
    (project / "repo").mkdir()
    (project / "repo" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "agent.py").write_text(AGENT, encoding="utf-8")
    return project


def test_an_unverified_run_exits_6_and_completes_once_the_code_checks_again(
    agent: Path, cli: Cli
) -> None:
    stopped = cli("run", "agent:fix", "--run-id", "fix-1")
    assert stopped.code == ExitCode.RUN_INTERRUPTED
    first, hint = stopped.err.splitlines()
    assert first.startswith("crashproof: error: run 'fix-1' stopped: unverified: act 'notes' ")
    assert "after the last passing 'tests'" in first
    assert hint.startswith("hint: its required check did not pass at the state it leaves")
    shown = cli("show", "fix-1", "--json").json()
    assert shown["status"] == "stopped"
    assert shown["reason"].startswith("unverified: ")
    assert shown["evidence"]["problems"] == [shown["reason"].removeprefix("unverified: ")]
    assert [s["kind"] for s in shown["steps"]] == ["act", "check", "act"]

    (agent / "final-check").touch()  # the fixed code: one more check after the last edit
    sys.modules.pop("agent", None)  # imported again, as a new process would
    resumed = cli("resume", "fix-1", "--app", "agent")
    assert resumed.code == ExitCode.OK, resumed.err
    shown = cli("show", "fix-1", "--json").json()
    assert shown["status"] == "succeeded"
    (check,) = shown["evidence"]["completion"]["checks"]
    assert check["step"] == "tests#2"
    assert check["environments"][0]["changed_during"] is False
    text = cli("show", "fix-1")
    assert text.code == ExitCode.OK
    assert "verified" in text.out
    assert "tests#2 passed at " in text.out
