"""Every failure: one error line, one hint line, no traceback, a documented exit code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crashproof.cli import ExitCode

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result
Calls = Callable[[], list[str]]


def _assert_clear(result: Any, code: ExitCode, *fragments: str) -> None:
    assert result.code == code, (result.out, result.err)
    lines = result.err.splitlines()
    assert len(lines) == 2, result.err
    assert lines[0].startswith("crashproof: error: ")
    assert lines[1].startswith("hint: ")
    assert len(lines[1]) > len("hint: ")
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in result.err


def test_conflicting_input_exits_4_and_changes_nothing(
    project: Path, cli: Cli, calls: Calls
) -> None:
    assert cli("run", "flows:greet", "--run-id", "g", "--arg", "name=ada").code == ExitCode.OK
    conflict = cli("run", "flows:greet", "--run-id", "g", "--arg", "name=bob")
    _assert_clear(conflict, ExitCode.CONFLICT, "run 'g' already exists", "--run-id")
    assert conflict.out == ""
    info = cli("show", "g", "--json").json()
    assert info["input"] == {"name": "ada"}
    assert calls() == ["compose", "choose"]


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("flows", "does not name a workflow"),
        ("flows:", "does not name a workflow"),
        (":greet", "does not name a workflow"),
        ("nosuchmodule:greet", "cannot import module 'nosuchmodule'"),
        ("flows:nope", "has no attribute 'nope'"),
        ("flows:helper", "not a crashproof workflow"),
        ("flows.py:greet", "name the module (`flows`)"),
        ("bad-name:greet", "is not a module name"),
        ("./flows:greet", "not a file path"),
    ],
)
def test_bad_workflow_targets(project: Path, cli: Cli, target: str, fragment: str) -> None:
    result = cli("run", target, "--run-id", "x", "--arg", "name=ada")
    _assert_clear(result, ExitCode.USAGE, fragment)
    assert not (project / "crashproof.db").exists()  # nothing was created


def test_missing_attribute_lists_the_workflows_of_the_module(project: Path, cli: Cli) -> None:
    result = cli("run", "flows:gret", "--run-id", "x")
    _assert_clear(result, ExitCode.USAGE, "greet (greet@1)", "explode (explode@1)")


@pytest.mark.parametrize(
    ("arg", "fragment"),
    [
        ("noequals", "is not KEY=VALUE"),
        ("=x", "is not KEY=VALUE"),
        ("1x=2", "is not a Python identifier"),
        ("run_id=3", "reserved"),
        ("big=1152921504606846976", "canonicalized"),
    ],
)
def test_bad_args(project: Path, cli: Cli, arg: str, fragment: str) -> None:
    result = cli("run", "flows:echo", "--run-id", "x", "--arg", arg)
    _assert_clear(result, ExitCode.USAGE, fragment)
    assert not (project / "crashproof.db").exists()


def test_duplicate_arg(project: Path, cli: Cli) -> None:
    result = cli("run", "flows:echo", "--run-id", "x", "--arg", "a=1", "--arg", "a=2")
    _assert_clear(result, ExitCode.USAGE, "given twice")


def test_args_that_do_not_fit_the_workflow(project: Path, cli: Cli) -> None:
    result = cli("run", "flows:greet", "--run-id", "x", "--arg", "nme=ada")
    _assert_clear(result, ExitCode.USAGE, "workflow 'greet'", "name, times")
    assert not (project / "crashproof.db").exists()


def test_empty_run_id(project: Path, cli: Cli) -> None:
    _assert_clear(cli("run", "flows:echo", "--run-id", " "), ExitCode.USAGE, "--run-id")


def test_module_that_raises_on_import(project: Path, cli: Cli) -> None:
    (project / "broken.py").write_text("raise RuntimeError('kaput')\n", encoding="utf-8")
    result = cli("run", "broken:wf", "--run-id", "x")
    _assert_clear(result, ExitCode.USAGE, "RuntimeError: kaput", "--verbose")
    verbose = cli("run", "broken:wf", "--run-id", "x", "--verbose")
    assert verbose.code == ExitCode.USAGE
    assert "Traceback" in verbose.err
    assert "kaput" in verbose.err


def test_module_with_a_missing_dependency(project: Path, cli: Cli) -> None:
    (project / "needs_dep.py").write_text("import no_such_dependency_xyz\n", encoding="utf-8")
    result = cli("run", "needs_dep:wf", "--run-id", "x")
    _assert_clear(result, ExitCode.USAGE, "no_such_dependency_xyz", "install")


@pytest.mark.parametrize("url", ["mysql://host/db", "sqlite:///", "sqlite:///:memory:", "x"])
def test_bad_ledger_url(project: Path, cli: Cli, url: str) -> None:
    _assert_clear(cli("run", "flows:echo", "--run-id", "x", "--db", url), ExitCode.USAGE, "URL")


@pytest.mark.parametrize(
    "argv",
    [
        ("runs",),
        ("show", "x"),
        ("resume", "x", "--app", "flows"),
        ("run", "flows:echo", "--run-id", "x"),
    ],
)
def test_db_pointing_at_a_text_file_is_refused_and_left_intact(
    project: Path, cli: Cli, argv: tuple[str, ...]
) -> None:
    notes = project / "notes.txt"
    notes.write_bytes(b"my precious notes\n" * 20)
    before = notes.read_bytes()
    result = cli(*argv, "--db", "sqlite:///notes.txt")
    _assert_clear(result, ExitCode.LEDGER_UNUSABLE, "notes.txt", "not a crashproof ledger")
    assert notes.read_bytes() == before
    assert sorted(p.name for p in project.iterdir() if p.name.startswith("notes")) == ["notes.txt"]


def test_sqlite_database_that_is_not_a_ledger(project: Path, cli: Cli) -> None:
    import sqlite3

    with sqlite3.connect(project / "other.db") as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.close()
    before = (project / "other.db").read_bytes()
    result = cli("runs", "--db", "sqlite:///other.db")
    _assert_clear(result, ExitCode.LEDGER_UNUSABLE, "not a crashproof ledger")
    assert (project / "other.db").read_bytes() == before


def test_ledger_from_a_newer_crashproof(project: Path, cli: Cli) -> None:
    import sqlite3

    assert cli("run", "flows:echo", "--run-id", "x").code == ExitCode.OK
    conn = sqlite3.connect(project / "crashproof.db")
    with conn:
        conn.execute("UPDATE crashproof_meta SET value = '999' WHERE key = 'schema_version'")
    conn.close()
    _assert_clear(cli("runs"), ExitCode.LEDGER_UNUSABLE, "newer", "upgrade crashproof")


def test_read_commands_never_create_a_ledger(project: Path, cli: Cli) -> None:
    for argv in (("runs",), ("show", "x")):
        _assert_clear(cli(*argv), ExitCode.LEDGER_UNUSABLE, "no ledger at crashproof.db")
    assert not (project / "crashproof.db").exists()


def test_show_of_an_unknown_run(project: Path, cli: Cli) -> None:
    assert cli("run", "flows:echo", "--run-id", "x").code == ExitCode.OK
    _assert_clear(cli("show", "nope"), ExitCode.USAGE, "no run 'nope'")


def test_usage_errors_from_the_parser(project: Path, cli: Cli) -> None:
    _assert_clear(cli("run", "flows:echo"), ExitCode.USAGE, "--run-id", "crashproof run --help")
    _assert_clear(cli("runs", "--status", "bogus"), ExitCode.USAGE, "bogus")
    _assert_clear(cli("frobnicate"), ExitCode.USAGE, "frobnicate")
    _assert_clear(cli("resume", "x"), ExitCode.USAGE, "--app")


def test_no_arguments_prints_help_and_exits_2(project: Path, cli: Cli) -> None:
    result = cli()
    assert result.code == ExitCode.USAGE
    assert "Usage" in result.out


def test_an_unexpected_exception_is_an_internal_error(
    project: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crashproof.runtime.ledger import Ledger

    assert cli("run", "flows:echo", "--run-id", "x").code == ExitCode.OK

    def broken(self: Ledger) -> dict[str, object]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Ledger, "leases", broken)  # `crashproof runs` reads the leases
    _assert_clear(cli("runs"), ExitCode.INTERNAL, "internal error: RuntimeError: a bug")
    verbose = cli("runs", "--verbose")
    assert verbose.code == ExitCode.INTERNAL
    assert "Traceback" in verbose.err


def test_ctrl_c_exits_130(project: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from crashproof.runtime.ledger import Ledger

    assert cli("run", "flows:echo", "--run-id", "x").code == ExitCode.OK

    def interrupted(self: Ledger) -> dict[str, object]:
        raise KeyboardInterrupt

    monkeypatch.setattr(Ledger, "leases", interrupted)
    assert cli("runs").code == ExitCode.INTERRUPTED


@pytest.mark.parametrize(
    ("argv", "configured"),
    [
        (("runs", "--json"), False),
        (("runs", "--json", "--verbose"), True),
        (("--verbose", "runs", "--json"), True),
        (("-v", "runs", "--json"), True),
    ],
)
def test_only_verbose_configures_logging(
    project: Path,
    cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    configured: bool,
) -> None:
    import logging

    assert cli("run", "flows:echo", "--run-id", "x").code == ExitCode.OK
    seen: list[dict[str, object]] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: seen.append(kw))
    assert cli(*argv).code == ExitCode.OK
    assert bool(seen) is configured
    if configured:
        assert seen[0]["level"] == logging.INFO
