"""The CLI side of issue 9: ``run --max-*`` limits, ``show --timeline`` (who wrote each
record, with which versions), and a resume that finds its workspace edited by hand:
exit code "frozen", both observations shown, nothing executed."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import ExitCode

Cli = Callable[..., Any]
Calls = Callable[[], list[str]]

EDITS = """
import pathlib

import crashproof as cp

WS = cp.Workspace(pathlib.Path("ws"))


def note():
    with pathlib.Path("calls.log").open("a", encoding="utf-8") as f:
        f.write("note\\n")
    return 1


@cp.workflow("edits", version="3")
def edits(ctx):
    ctx.act("a", WS, op="write", path="a.txt", content="a\\n")
    ctx.step("note", note)
    ctx.act("b", WS, op="write", path="b.txt", content="b\\n")
    return "done"
"""


@pytest.fixture
def crashed(project: Path) -> Iterator[Any]:
    """A run of edits.py killed after its step, between its two acts."""
    (project / "ws").mkdir()
    (project / "ws" / "keep.txt").write_text("base\n")
    (project / "edits.py").write_text(EDITS, encoding="utf-8")
    sys.path.insert(0, str(project))  # the project fixture restores sys.path
    module = importlib.import_module("edits")
    points = cp.CrashPoints(match="after_commit[step_done:note]")
    with (
        cp.Ledger("sqlite:///crashproof.db", crash_points=points) as ledger,
        pytest.raises(cp.SimulatedCrash),
    ):
        ledger.run(module.edits, run_id="e:1")
    yield module
    sys.modules.pop("edits", None)


def test_unchanged_workspace_resumes(cli: Cli, calls: Calls, crashed: Any, project: Path) -> None:
    result = cli("resume", "e:1", "--app", "edits")
    assert result.code == ExitCode.OK, result.err
    assert (project / "ws" / "b.txt").read_text() == "b\n"
    assert calls() == ["note"]


def test_hand_edit_freezes_with_both_observations(
    cli: Cli, calls: Calls, crashed: Any, project: Path
) -> None:
    recorded = crashed.WS.observe()
    (project / "ws" / "keep.txt").write_text("edited by hand\n")
    observed = crashed.WS.observe()
    result = cli("resume", "e:1", "--app", "edits")
    assert result.code == ExitCode.RUN_FROZEN, result.err
    assert "environment drifted" in result.err
    assert not (project / "ws" / "b.txt").exists()  # nothing executed
    assert calls() == ["note"]
    shown = cli("show", "e:1")
    assert shown.code == ExitCode.OK
    assert "environments changed" in shown.out
    assert recorded.fingerprint in shown.out
    assert observed.fingerprint in shown.out
    info = cli("show", "e:1", "--json").json()
    assert info["status"] == "needs_review"
    (change,) = info["evidence"]["environments"]
    assert change["recorded"]["fingerprint"] != change["observed"]["fingerprint"]
    assert change["observed"]["fingerprint"] == observed.fingerprint


def test_timeline_attributes_every_record(cli: Cli, crashed: Any) -> None:
    assert cli("resume", "e:1", "--app", "edits").code == ExitCode.OK
    entries = cli("show", "e:1", "--timeline", "--json").json()["timeline"]
    with cp.Ledger("sqlite:///crashproof.db") as ledger:
        events = ledger._store.load_events("e:1")
    assert [e["seq"] for e in entries] == [e.seq for e in events]
    assert all(e["worker"] and e["crashproof"] == cp.__version__ for e in entries)
    assert all(e["workflow_version"] == "3" for e in entries)
    sessions = sorted({e["session"] for e in entries if e["session"] is not None})
    assert len(sessions) == 2  # the crashed drive, then the resume
    workers = {e["session"]: e["worker"] for e in entries}
    assert workers[sessions[0]] != workers[sessions[1]]  # two Ledgers, two worker ids
    table = cli("show", "e:1", "--timeline")
    assert table.code == ExitCode.OK
    assert "act_intent" in table.out
    assert workers[sessions[1]] in table.out


def test_run_limits_map_to_the_recorded_limits(cli: Cli, calls: Calls) -> None:
    result = cli("run", "flows:greet", "--run-id", "g:1", "-a", "name=Ada", "--max-steps", "1")
    assert result.code == ExitCode.RUN_INTERRUPTED, result.err
    info = cli("show", "g:1", "--json").json()
    assert info["status"] == "stopped"
    assert info["reason"] == "budget:steps"
    assert info["limits"]["steps"] == 1
    assert calls() == ["compose"]
    raised = cli("resume", "g:1", "--app", "flows", "--raise-budget", "steps=5", "--by", "ops")
    assert raised.code == ExitCode.OK, raised.err
    entries = cli("show", "g:1", "--timeline", "--json").json()["timeline"]
    (operator,) = [e for e in entries if e["type"] == "budget_raised"]
    assert operator["operator"]["by"] == "ops"
    assert operator["worker"] is not None  # the drive that followed, under its lease


def test_all_run_limits_and_bad_values(cli: Cli, project: Path) -> None:
    result = cli(
        "run", "flows:greet", "--run-id", "g:2", "-a", "name=Ada",
        "--max-decisions", "4", "--max-tokens", "999", "--max-cost", "0.5", "--max-wall", "60",
    )  # fmt: skip
    assert result.code == ExitCode.OK, result.err
    limits = cli("show", "g:2", "--json").json()["limits"]
    assert limits == {
        "steps": None,
        "decisions": 4,
        "tokens": 999,
        "cost": 0.5,
        "wall_time": 60.0,
    }
    bad = cli("run", "flows:greet", "--run-id", "g:3", "-a", "name=Ada", "--max-cost", "-1")
    assert bad.code == ExitCode.USAGE
    assert "nothing was started" in bad.err
    assert cli("show", "g:3").code != ExitCode.OK
