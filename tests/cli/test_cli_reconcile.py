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
