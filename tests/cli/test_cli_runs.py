"""run -> show -> runs, in people's tables and in scripts' JSON."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashproof.cli import ExitCode

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result
Calls = Callable[[], list[str]]

RUN = ("run", "flows:greet", "--run-id", "greet:ada:1", "--arg", "name=ada", "--arg", "times=2")


def test_run_prints_result_and_show_and_runs_describe_it(project: Path, cli: Cli) -> None:
    ran = cli(*RUN)
    assert ran.code == ExitCode.OK, ran.err
    assert ran.json() == {"text": "hello ada", "times": 2}
    assert "greet:ada:1" in ran.err
    assert "succeeded" in ran.err
    assert (project / "crashproof.db").exists()

    shown = cli("show", "greet:ada:1")
    assert shown.code == ExitCode.OK, shown.err
    for text in ("greet:ada:1", "greet", "succeeded", "compose", "choose", "decide"):
        assert text in shown.out
    assert "fake-model-1" in shown.out
    assert "15" in shown.out
    assert "hello ada" in shown.out  # the result

    listed = cli("runs")
    assert listed.code == ExitCode.OK, listed.err
    assert "greet:ada:1" in listed.out
    assert "greet@1" in listed.out
    assert "succeeded" in listed.out
    assert "0.0020" in listed.out


def test_json_output_of_run_show_and_runs(project: Path, cli: Cli) -> None:
    ran = cli(*RUN, "--json")
    assert ran.code == ExitCode.OK, ran.err
    info = ran.json()
    assert info["run_id"] == "greet:ada:1"
    assert (info["workflow"], info["version"], info["status"]) == ("greet", "1", "succeeded")
    assert info["result"] == {"text": "hello ada", "times": 2}
    assert info["input"] == {"name": "ada", "times": 2}
    assert len(info["input_digest"]) == 64
    assert info["budget"] == {
        "steps": 2,
        "decisions": 1,
        "tokens": 15,
        "cost": 0.002,
        "unknowns": 0,
    }
    steps = {s["key"]: s for s in info["steps"]}
    assert steps["compose"]["kind"] == "step"
    assert steps["compose"]["status"] == "succeeded"
    assert steps["choose"]["model"] == "fake-model-1"
    assert steps["choose"]["usage"] == {"input_tokens": 10, "output_tokens": 5}

    shown = cli("show", "greet:ada:1", "--json").json()
    assert shown == info

    listed = cli("runs", "--json").json()
    assert [r["run_id"] for r in listed] == ["greet:ada:1"]
    assert listed[0]["status"] == "succeeded"


@pytest.mark.parametrize(
    "argv",
    [
        ("--json", "runs"),
        ("runs", "--json"),
        ("--db", "sqlite:///crashproof.db", "runs", "--json"),
        ("runs", "--db", "sqlite:///crashproof.db", "--json"),
        ("--json", "--db", "sqlite:///crashproof.db", "runs"),
        ("--db", "sqlite:///elsewhere.db", "runs", "--db", "sqlite:///crashproof.db", "--json"),
    ],
)
def test_global_options_work_before_and_after_the_command(
    project: Path, cli: Cli, argv: tuple[str, ...]
) -> None:
    assert cli(*RUN).code == ExitCode.OK
    listed = cli(*argv)
    assert listed.code == ExitCode.OK, listed.err
    assert [r["run_id"] for r in listed.json()] == ["greet:ada:1"]


def test_running_twice_returns_the_same_result_without_rerunning_steps(
    project: Path, cli: Cli, calls: Calls
) -> None:
    first = cli(*RUN)
    second = cli(*RUN)
    assert first.code == second.code == ExitCode.OK
    assert first.out == second.out
    assert calls() == ["compose", "choose"]  # nothing ran the second time


def test_runs_filters_by_status(project: Path, cli: Cli) -> None:
    assert cli(*RUN).code == ExitCode.OK
    assert cli("run", "flows:explode", "--run-id", "boom:1").code == ExitCode.RUN_FAILED
    failed = cli("runs", "--status", "failed", "--json")
    assert failed.code == ExitCode.OK
    assert [r["run_id"] for r in failed.json()] == ["boom:1"]
    empty = cli("runs", "--status", "needs_review")
    assert empty.code == ExitCode.OK
    assert "no runs with status needs_review" in empty.out


def test_run_arg_values_are_json_when_valid_else_strings(project: Path, cli: Cli) -> None:
    ran = cli(
        "run",
        "flows:echo",
        "--run-id",
        "echo:1",
        "--arg",
        "n=3",
        "--arg",
        "flag=true",
        "--arg",
        "tags=[1, 2]",
        "--arg",
        "word=hello",
        "--arg",
        "zip=007",
        "--arg",
        'quoted="7"',
        "--arg",
        "empty=",
        "--arg",
        "nan=NaN",
        "-a",
        "eq=a=b",
    )
    assert ran.code == ExitCode.OK, ran.err
    assert ran.json() == {
        "n": 3,
        "flag": True,
        "tags": [1, 2],
        "word": "hello",
        "zip": "007",
        "quoted": "7",
        "empty": "",
        "nan": "NaN",
        "eq": "a=b",
    }


def test_a_failed_run_exits_1_records_the_failure_and_is_not_rerun(
    project: Path, cli: Cli, calls: Calls
) -> None:
    failed = cli("run", "flows:explode", "--run-id", "boom:1")
    assert failed.code == ExitCode.RUN_FAILED
    assert failed.out == ""
    lines = failed.err.splitlines()
    assert lines[0].startswith("crashproof: error: run 'boom:1' failed")
    assert "boom [red]not markup[/red]" in lines[0]
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in failed.err

    again = cli("run", "flows:explode", "--run-id", "boom:1", "--json")
    assert again.code == ExitCode.RUN_FAILED
    info = again.json()  # scripts still get the run's record
    assert info["status"] == "failed"
    assert info["error"]["type"] == "builtins.ValueError"
    assert calls() == ["boom"]

    shown = cli("show", "boom:1")
    assert shown.code == ExitCode.OK
    assert "failed" in shown.out
    assert "[red]not markup[/red]" in shown.out


def test_memory_ledger_runs(project: Path, cli: Cli) -> None:
    ran = cli(*RUN, "--db", "memory://")
    assert ran.code == ExitCode.OK, ran.err
    assert ran.json()["text"] == "hello ada"
    assert not (project / "crashproof.db").exists()


def test_runs_finds_runs_newest_first_by_workflow_status_time_and_limit(
    project: Path, cli: Cli
) -> None:
    for n in range(3):
        assert cli("run", "flows:greet", "--run-id", f"g:{n}", "--arg", "name=x").code == 0
    assert cli("run", "flows:explode", "--run-id", "boom:1").code == ExitCode.RUN_FAILED
    listed = cli("runs", "--json")
    assert [r["run_id"] for r in listed.json()] == ["boom:1", "g:2", "g:1", "g:0"]
    assert all("steps" not in r for r in listed.json())  # `show --json` has them
    greet = cli("runs", "--workflow", "greet", "--json").json()
    assert [r["run_id"] for r in greet] == ["g:2", "g:1", "g:0"]
    assert [r["run_id"] for r in cli("runs", "--status", "failed", "--json").json()] == ["boom:1"]
    newest = cli("runs", "--limit", "2", "--json")
    assert [r["run_id"] for r in newest.json()] == ["boom:1", "g:2"]
    assert "showing the newest 2 of 4 runs" in newest.err
    assert len(cli("runs", "--limit", "0", "--json").json()) == 4
    assert len(cli("runs", "--since", "1h", "--json").json()) == 4
    assert cli("runs", "--since", "2999-01-01", "--json").json() == []
    assert len(cli("runs", "--since", "2000-01-01T00:00+02:00", "--json").json()) == 4


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--since", "yesterday"), "neither an age"),
        (("--since", "5 parsecs"), "neither an age"),
        (("--limit", "-1"), "negative"),
        (("--limit", "many"), "--limit"),
    ],
)
def test_runs_refuses_a_bad_filter_with_one_line(
    project: Path, cli: Cli, argv: tuple[str, ...], fragment: str
) -> None:
    assert cli(*RUN).code == ExitCode.OK
    refused = cli("runs", *argv)
    assert refused.code == ExitCode.USAGE, refused.err
    assert fragment in refused.err
    assert "Traceback" not in refused.err


def test_the_run_id_stays_at_80_columns(
    project: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_id = "repo:obsidian_hub:upgrade-dependencies:2026-08-14"
    assert cli("run", "flows:greet", "--run-id", long_id, "--arg", "name=x").code == 0
    monkeypatch.setenv("COLUMNS", "80")
    listed = cli("runs")
    assert listed.code == ExitCode.OK
    assert max(len(line) for line in listed.out.splitlines()) <= 80
    folded = "".join(line.split()[0] for line in listed.out.splitlines()[3:] if line.strip())
    assert long_id in folded
