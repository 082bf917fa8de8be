"""`crashproof reconcile`: recorded receipts against the tools' own lookups."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

EDITS = """
import crashproof as cp

ws = cp.Workspace("ws")


@cp.workflow("edits", version="1")
def edits(ctx):
    ctx.act("one", ws, op="write", path="one.txt", content="1\\n")
    ctx.act("two", ws, op="write", path="two.txt", content="2\\n")
    return "done"
"""


@pytest.fixture
def edits(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (project / "edits.py").write_text(EDITS, encoding="utf-8")
    (project / "ws").mkdir()
    monkeypatch.delitem(sys.modules, "edits", raising=False)
    return project


def test_reconcile_confirms_then_reports_drift(edits: Path, cli: Cli) -> None:
    assert cli("run", "edits:edits", "--run-id", "e1").code == 0
    ok = cli("reconcile", "e1", "--app", "edits", "--json")
    assert ok.code == 0
    assert [(c["step"], c["status"]) for c in ok.json()] == [
        ("one", "confirmed"),
        ("two", "confirmed"),
    ]
    (edits / "ws" / "two.txt").write_text("changed by hand\n")
    drift = cli("reconcile", "--app", "edits")  # all runs, human output
    assert drift.code == 4
    assert "drifted" in drift.out
    assert "two.txt" in drift.out


def test_reconcile_without_the_tools_needs_review(edits: Path, cli: Cli) -> None:
    assert cli("run", "edits:edits", "--run-id", "e1").code == 0
    result = cli("reconcile", "e1", "--json")
    assert result.code == 3
    assert {c["status"] for c in result.json()} == {"needs_review"}
    assert cli("reconcile", "nope", "--app", "edits").code == 2


def test_reconcile_record_journals_findings_that_runs_and_show_read(edits: Path, cli: Cli) -> None:
    assert cli("run", "edits:edits", "--run-id", "e1").code == 0
    assert cli("run", "edits:edits", "--run-id", "e2").code == 0  # same files: superseded
    (edits / "ws" / "two.txt").write_text("changed by hand\n")
    recorded = cli("reconcile", "e2", "--app", "edits", "--record", "--by", "alice")
    assert recorded.code == 4  # drifted
    listed = cli("runs", "--drifted", "--json").json()
    assert [r["run_id"] for r in listed] == ["e2"]
    assert listed[0]["drifted"] == ["two"]
    assert listed[0]["status"] == "succeeded"  # nothing that ended is frozen
    table = cli("runs")
    assert "(1 drifted)" in table.out
    shown = cli("show", "e2")
    assert "reconciled" in shown.out
    assert "by alice; drifted: two" in shown.out
    timeline = cli("show", "e2", "--timeline", "--json").json()["timeline"]
    assert [e["type"] for e in timeline][-2:] == ["act_reconciled", "act_reconciled"]
    (edits / "ws" / "two.txt").write_text("2\n")  # put back
    again = cli("reconcile", "e2", "--app", "edits", "--record", "--by", "bob")
    assert again.code == 0
    assert cli("runs", "--drifted", "--json").json() == []
    assert cli("check").code == 0  # the records are sealed and chained like any other


def test_worker_reconcile_every_takes_a_duration(edits: Path, cli: Cli) -> None:
    for bad in ("soon", "0", "-5m", "1x", "nan"):
        refused = cli("worker", "--app", "edits", "--reconcile-every", bad, "--until-idle")
        assert refused.code == 2, bad
        assert "is not a duration" in refused.err
        assert "Traceback" not in refused.err
    assert cli("run", "edits:edits", "--run-id", "e1").code == 0
    (edits / "ws" / "one.txt").unlink()
    done = cli("worker", "--app", "edits", "--reconcile-every", "1h", "--until-idle")
    assert done.code == 0, done.err
    assert '"event": "reconciled"' in done.err
    assert [r["run_id"] for r in cli("runs", "--drifted", "--json").json()] == ["e1"]


TWO_ROOTS = """
import crashproof as cp
from crashproof.tools.git import GitTool

ws_a = cp.Workspace("a")
ws_b = cp.Workspace("b")
gone = GitTool("no-such-repo")  # its instance cannot be told: still loaded, by name


@cp.workflow("roots", version="1")
def roots(ctx):
    ctx.act("a", ws_a, op="write", path="out.txt", content="from a\\n")
    ctx.act("b", ws_b, op="write", path="out.txt", content="from b\\n")
"""


def test_reconcile_checks_each_workspace_of_the_app_against_its_own_root(
    project: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both workspaces of --app are kept (they share the name ``workspace``) and each
    act is looked up under the root it wrote to, not under the first one found."""
    (project / "roots.py").write_text(TWO_ROOTS, encoding="utf-8")
    (project / "a").mkdir()
    (project / "b").mkdir()
    monkeypatch.delitem(sys.modules, "roots", raising=False)
    assert cli("run", "roots:roots", "--run-id", "r1").code == 0
    ok = cli("reconcile", "r1", "--app", "roots", "--json")
    assert [(c["step"], c["status"]) for c in ok.json()] == [("a", "confirmed"), ("b", "confirmed")]
    assert ok.code == 0
    (project / "b" / "out.txt").write_text("changed by hand\n")
    drift = cli("reconcile", "r1", "--app", "roots", "--json")
    assert [(c["step"], c["status"]) for c in drift.json()] == [
        ("a", "confirmed"),
        ("b", "drifted"),
    ]
    assert drift.code == 4
