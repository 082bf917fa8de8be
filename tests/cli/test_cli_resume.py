"""resume: finishing interrupted runs, refusing what cannot be resumed, changing nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashproof.cli import ExitCode

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result
Calls = Callable[[], list[str]]


def _snapshot(cli: Cli) -> object:
    listed = cli("runs", "--json")
    assert listed.code == ExitCode.OK, listed.err
    return listed.json()


def _start_greet(cli: Cli) -> None:
    ran = cli("run", "flows:greet", "--run-id", "greet:1", "--arg", "name=ada")
    assert ran.code == ExitCode.OK, ran.err


def test_resume_of_an_unknown_run_id_is_a_clear_error_and_changes_nothing(
    project: Path, cli: Cli
) -> None:
    _start_greet(cli)
    before = _snapshot(cli)
    resumed = cli("resume", "no-such-run", "--app", "flows")
    assert resumed.code == ExitCode.USAGE
    assert resumed.out == ""
    lines = resumed.err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("crashproof: error: no run 'no-such-run'")
    assert lines[1].startswith("hint: ")
    assert "crashproof runs" in lines[1]
    assert _snapshot(cli) == before


def test_resume_with_an_app_lacking_the_workflow_is_a_clear_error_and_changes_nothing(
    project: Path, cli: Cli, calls: Calls
) -> None:
    interrupted = cli("run", "flows:flaky", "--run-id", "flaky:1")
    assert interrupted.code == ExitCode.RUN_INTERRUPTED
    before = _snapshot(cli)
    resumed = cli("resume", "flaky:1", "--app", "others")
    assert resumed.code == ExitCode.USAGE
    first, hint = resumed.err.splitlines()
    assert first.startswith("crashproof: error: run 'flaky:1' needs workflow 'flaky'")
    assert "unrelated" in first  # what the --app module did register
    assert hint.startswith("hint: ")
    assert "--app" in hint
    assert _snapshot(cli) == before
    assert calls() == ["first", "first"]


def test_an_interrupted_run_is_resumed_without_rerunning_recorded_steps(
    project: Path, cli: Cli, calls: Calls
) -> None:
    interrupted = cli("run", "flows:flaky", "--run-id", "flaky:1", "--json")
    assert interrupted.code == ExitCode.RUN_INTERRUPTED
    assert "SerializationError" in interrupted.err
    assert "crashproof resume" in interrupted.err  # the hint says what to do
    assert interrupted.json()["status"] == "running"

    (project / "ready.txt").write_text("", encoding="utf-8")
    resumed = cli("resume", "flaky:1", "--app", "flows")
    assert resumed.code == ExitCode.OK, resumed.err
    assert resumed.json() == [1]
    assert calls() == ["first", "first"]  # replayed, not re-executed

    again = cli("resume", "flaky:1", "--app", "flows", "--json")
    assert again.code == ExitCode.OK
    assert again.json()["status"] == "succeeded"
    assert calls() == ["first", "first"]


def test_a_frozen_run_exits_3_and_show_explains_why(project: Path, cli: Cli) -> None:
    assert cli("run", "flows:flaky", "--run-id", "flaky:1").code == ExitCode.RUN_INTERRUPTED
    (project / "swerve.txt").write_text("", encoding="utf-8")  # the code now takes another path
    frozen = cli("resume", "flaky:1", "--app", "flows")
    assert frozen.code == ExitCode.RUN_FROZEN
    assert frozen.err.startswith("crashproof: error: run 'flaky:1' is needs_review")
    assert "crashproof show flaky:1" in frozen.err

    shown = cli("show", "flaky:1")
    assert "needs_review" in shown.out
    assert "evidence" in shown.out
    info = cli("show", "flaky:1", "--json").json()
    assert info["status"] == "needs_review"
    assert info["evidence"] is not None
    assert [r["run_id"] for r in cli("runs", "--status", "needs_review", "--json").json()] == [
        "flaky:1"
    ]


def test_resume_of_a_finished_run_returns_its_result(project: Path, cli: Cli, calls: Calls) -> None:
    _start_greet(cli)
    resumed = cli("resume", "greet:1", "--app", "others", "--app", "flows")
    assert resumed.code == ExitCode.OK, resumed.err
    assert resumed.json() == {"text": "hello ada", "times": 1}
    assert calls() == ["compose", "choose"]


def test_resume_needs_an_existing_ledger(project: Path, cli: Cli) -> None:
    resumed = cli("resume", "x", "--app", "flows")
    assert resumed.code == ExitCode.LEDGER_UNUSABLE
    assert "no ledger at crashproof.db" in resumed.err
    assert not (project / "crashproof.db").exists()


def test_resume_app_module_without_workflows(project: Path, cli: Cli) -> None:
    (project / "plain.py").write_text("X = 1\n", encoding="utf-8")
    _start_greet(cli)
    resumed = cli("resume", "greet:1", "--app", "plain")
    assert resumed.code == ExitCode.USAGE
    assert "module 'plain' defines no crashproof workflows" in resumed.err


def test_resume_app_modules_defining_one_workflow_twice(project: Path, cli: Cli) -> None:
    (project / "greet_v2.py").write_text(
        "import crashproof as cp\n\n"
        "@cp.workflow('greet', version='2')\n"
        "def greet(ctx, name):\n"
        "    return name\n",
        encoding="utf-8",
    )
    _start_greet(cli)
    resumed = cli("resume", "greet:1", "--app", "flows", "--app", "greet_v2")
    assert resumed.code == ExitCode.USAGE
    assert "workflow 'greet' is defined twice" in resumed.err


def test_resume_of_a_run_started_on_another_version(project: Path, cli: Cli) -> None:
    (project / "greet_v2.py").write_text(
        "import crashproof as cp\n\n"
        "@cp.workflow('greet', version='2')\n"
        "def greet(ctx, name):\n"
        "    return name\n",
        encoding="utf-8",
    )
    _start_greet(cli)
    before = _snapshot(cli)
    resumed = cli("resume", "greet:1", "--app", "greet_v2")
    assert resumed.code == ExitCode.USAGE
    assert "version" in resumed.err
    assert _snapshot(cli) == before


def test_run_and_resume_drive_an_async_workflow(project: Path, cli: Cli, calls: Calls) -> None:
    interrupted = cli("run", "flows:agreet", "--run-id", "a:1", "--arg", "name=ada")
    assert interrupted.code == ExitCode.RUN_INTERRUPTED, interrupted.err
    (project / "ready.txt").write_text("", encoding="utf-8")
    resumed = cli("resume", "a:1", "--app", "flows")
    assert resumed.code == ExitCode.OK, resumed.err
    assert resumed.json() == {"text": "hello ada"}
    assert calls() == ["acompose"]  # replayed on resume, not run again
