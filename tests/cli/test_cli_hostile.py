"""Hostile input and data (#26 items 5-7): control characters recorded in the ledger never
reach the terminal, and every bad input found from the outside exits with a documented
code, one error line and a hint, never exit 70 or a traceback."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import ExitCode

Cli = Callable[..., Any]


def _assert_clear(result: Any, code: ExitCode, *fragments: str) -> None:
    """One error line, one hint line, the documented code (as in test_cli_errors.py)."""
    assert result.code == code, (result.out, result.err)
    lines = result.err.splitlines()
    assert len(lines) == 2, result.err
    assert lines[0].startswith("crashproof: error: ")
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in result.err


# ESC[2J clears the screen, OSC 52 writes the clipboard, 0x9b is a one-byte CSI, U+202E
# reverses the text after it.
HOSTILE_ID = "e\x1b[2Jx"
HOSTILE_KEY = "s\x1b]52;c;aGk=\x07"
HOSTILE_VALUE = "v\x9b2J\u202eevil"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

FLOWS = """
import crashproof as cp


@cp.workflow("hostile", version="1")
def hostile(ctx):
    return ctx.step(KEY, lambda: VALUE)


@cp.workflow("base", version="1")
def base(ctx):
    ctx.step("a", lambda: 1)
    raise BaseException("out of the run")


@cp.workflow("genexit", version="1")
def genexit(ctx):
    raise GeneratorExit
"""


@pytest.fixture
def hostile(project: Path) -> Path:
    """A ledger holding a run whose id, step key and result carry control characters,
    recorded through the library (which takes any string)."""
    source = FLOWS.replace("KEY", repr(HOSTILE_KEY)).replace("VALUE", repr(HOSTILE_VALUE))
    (project / "hostile_flows.py").write_text(source, encoding="utf-8")
    ledger = cp.Ledger(f"sqlite:///{project / 'crashproof.db'}")
    try:
        namespace: dict[str, Any] = {}
        exec(compile(source, "hostile_flows.py", "exec"), namespace)
        ledger.run(namespace["hostile"], run_id=HOSTILE_ID)
    finally:
        ledger.close()
    return project


@pytest.mark.parametrize(
    "argv",
    [
        ("runs",),
        ("show", HOSTILE_ID),
        ("show", HOSTILE_ID, "--timeline"),
        ("runs", "--json"),
        ("show", HOSTILE_ID, "--json"),
        ("check",),
        ("show", "nope\x1b[2J"),  # an error line that names the argument
    ],
)
def test_control_characters_from_the_ledger_never_reach_the_terminal(
    hostile: Path, cli: Cli, argv: tuple[str, ...]
) -> None:
    result = cli(*argv)
    assert result.code in (ExitCode.OK, ExitCode.USAGE), result.err
    assert not RAW.search(result.out), result.out
    assert not RAW.search(result.err), result.err
    shown = result.out + result.err
    if "--json" in argv:  # the same values, as JSON escapes
        data = json.loads(result.out)
        record = data[0] if isinstance(data, list) else data
        assert record["run_id"] == HOSTILE_ID
        if "steps" in record:
            assert record["steps"][0]["key"] == HOSTILE_KEY
            assert record["result"] == HOSTILE_VALUE
    elif argv[0] == "check":
        assert "e\\x1b[2Jx" in shown
    else:
        assert ("nope\\x1b[2J" if "nope\x1b[2J" in argv else "e\\x1b[2Jx") in shown


def test_show_escapes_recorded_keys_and_values(hostile: Path, cli: Cli) -> None:
    out = cli("show", HOSTILE_ID).out
    assert "s\\x1b]52;c;aGk=\\x07" in out
    assert "v\\x9b2J\\u202eevil" in out


def test_a_run_id_with_control_characters_is_refused(project: Path, cli: Cli) -> None:
    result = cli("run", "flows:echo", "--run-id", HOSTILE_ID)
    _assert_clear(result, ExitCode.USAGE, "control characters", "'e\\x1b[2Jx'")
    assert not RAW.search(result.err)
    assert not (project / "crashproof.db").exists()


def test_a_run_id_that_is_not_utf8_is_a_usage_error(project: Path, cli: Cli) -> None:
    not_utf8 = b"r\xff".decode("utf-8", "surrogateescape")  # as Python reads $'r\xff'
    result = cli("run", "flows:echo", "--run-id", not_utf8)
    _assert_clear(result, ExitCode.USAGE, "not valid UTF-8", "b'r\\xff'")
    assert not (project / "crashproof.db").exists()
    _assert_clear(cli("show", not_utf8), ExitCode.USAGE, "not valid UTF-8")


@pytest.mark.parametrize("out", ["missing/dir/x.json", "a-file/x.json", "readonly/x.json"])
def test_export_to_an_unwritable_path_changes_nothing(project: Path, cli: Cli, out: str) -> None:
    assert cli("run", "flows:echo", "--run-id", "x").code == ExitCode.OK
    (project / "a-file").write_text("")
    (project / "readonly").mkdir(mode=0o500)
    target = project / out
    if out.startswith("readonly") and os.access(target.parent, os.W_OK):
        pytest.skip("running as root: a mode 0500 directory is writable")
    result = cli("export", "x", "--out", str(target))
    _assert_clear(result, ExitCode.USAGE, "cannot create", "nothing was exported")
    assert cli("show", "x", "--json").json()["status"] == "succeeded"  # not moved out
    assert not target.exists()


def test_export_over_an_existing_file_changes_nothing(project: Path, cli: Cli) -> None:
    assert cli("run", "flows:echo", "--run-id", "x").code == ExitCode.OK
    (project / "x.json").write_text("mine\n")
    _assert_clear(cli("export", "x", "--out", "x.json"), ExitCode.USAGE, "already exists")
    assert (project / "x.json").read_text() == "mine\n"
    assert cli("show", "x", "--json").json()["status"] == "succeeded"


@pytest.mark.parametrize("depth", [50_000, 5_000])
def test_an_arg_nested_too_deeply_is_a_usage_error(project: Path, cli: Cli, depth: int) -> None:
    deep = "[" * depth + "]" * depth
    result = cli("run", "flows:echo", "--run-id", "deep", "--arg", f"x={deep}")
    _assert_clear(result, ExitCode.USAGE, "nested too deeply", "--arg x")
    assert not (project / "crashproof.db").exists()


@pytest.mark.parametrize(
    ("workflow", "name"), [("base", "BaseException"), ("genexit", "GeneratorExit")]
)
def test_a_base_exception_in_a_workflow_leaves_it_resumable_without_a_traceback(
    hostile: Path, cli: Cli, workflow: str, name: str
) -> None:
    result = cli("run", f"hostile_flows:{workflow}", "--run-id", workflow)
    _assert_clear(result, ExitCode.RUN_INTERRUPTED, f"{name} escaped the run", "resume")
    assert cli("show", workflow, "--json").json()["status"] == "running"


def test_a_lease_expiry_past_any_calendar_is_shown_not_crashed_on(hostile: Path, cli: Cli) -> None:
    assert cli("run", "hostile_flows:base", "--run-id", "b").code == ExitCode.RUN_INTERRUPTED
    with sqlite3.connect(hostile / "crashproof.db") as conn:  # someone edits the file
        conn.execute(
            "UPDATE runs SET lease_expires_at = 9e12, owner = 'elsewhere:1:x' WHERE run_id = 'b'"
        )
    conn.close()
    listed = cli("runs")
    assert listed.code == ExitCode.OK, listed.err
    assert "not a date" in listed.out
    records = {r["run_id"]: r for r in cli("runs", "--json").json()}
    assert records["b"]["lease_expires_at"] == 9e12
    assert cli("show", "b", "--timeline").code == ExitCode.OK
    resumed = cli("resume", "b", "--app", "hostile_flows")
    _assert_clear(resumed, ExitCode.CONFLICT, "9000000000000.0 (not a date", "take it over")


@pytest.mark.parametrize("query", ["?mode=ro", "?mode=ro&cache=shared", "#x"])
def test_a_sqlite_url_with_a_query_string_is_refused(project: Path, cli: Cli, query: str) -> None:
    url = f"sqlite:///x.db{query}"
    for argv in (("run", "flows:echo", "--run-id", "q"), ("runs",)):
        _assert_clear(cli(*argv, "--db", url), ExitCode.USAGE, "query string", "sqlite:///")
    assert sorted(p.name for p in project.iterdir() if p.name.startswith("x.db")) == []


def test_the_library_refuses_a_sqlite_url_with_a_query_string(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="query string"):
        cp.Ledger(f"sqlite:///{tmp_path}/x.db?mode=ro")
    assert list(tmp_path.iterdir()) == []
