"""Reconciliation: every recorded receipt compared with the tool's own lookup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import crashproof as cp
from integration._targets import BlindTool, Target, TargetTool


def test_workspace_acts_confirmed_superseded_and_drifted(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    ws = cp.Workspace(tmp_path / "ws")

    @cp.workflow("edits", version="1")
    def edits(ctx: cp.Context) -> None:
        ctx.act("a1", ws, op="append", path="a.txt", text="one\n")
        ctx.act("a2", ws, op="append", path="a.txt", text="two\n")
        ctx.act("b", ws, op="write", path="b.txt", content="bee\n")

    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.run(edits, run_id="r")
    checks = {c.step: c for c in ledger.reconcile("r", [ws])}
    assert {k: c.status for k, c in checks.items()} == {
        "a1": "confirmed",
        "a2": "confirmed",
        "b": "confirmed",
    }
    assert "superseded by 'a2'" in checks["a1"].detail
    (tmp_path / "ws" / "b.txt").write_text("someone else\n")
    checks = {c.step: c for c in ledger.reconcile("r", [ws])}
    assert checks["b"].status == "drifted"
    assert checks["a2"].status == "confirmed"
    assert checks["b"].operation_id == "r/b"


def test_receipts_against_a_target(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool, blind = TargetTool(target), BlindTool(target)

    @cp.workflow("two", version="1")
    def two(ctx: cp.Context) -> None:
        ctx.act("one", tool, n=1)
        ctx.act("two", tool, n=2)
        ctx.act("three", blind, n=3)

    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.run(two, run_id="r")
    assert [c.status for c in ledger.reconcile("r", [tool, blind])] == [
        "confirmed",
        "confirmed",
        "needs_review",  # no lookup: nobody can tell
    ]
    state = target.state()
    del state["records"]["r/one"]  # deleted behind our back
    state["records"]["r/two"]["id"] = "rec-other"  # replaced behind our back
    target.save(state)
    checks = ledger.reconcile("r", [tool])
    assert [c.status for c in checks] == ["drifted", "drifted", "needs_review"]
    assert "no longer holds" in checks[0].detail
    assert "rec-other" in checks[1].detail
    assert "not available here" in checks[2].detail
    assert json.dumps([c.to_json() for c in checks])  # JSON-ready for the CLI
    with pytest.raises(cp.RunNotFound):
        ledger.reconcile("nope", [tool])
