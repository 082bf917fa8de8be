"""A run started on v1 and killed, resumed by a process that only knows v2: refused with
both versions named when v2 cannot replay it; finished with the very artifacts of an
uninterrupted v1 run when v2 declares compatible_with or keeps the old branch behind
ctx.patched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import crashproof as cp


def v1(ws: cp.Workspace) -> cp.Workflow[Any]:
    @cp.workflow("edit", version="1")
    def edit(ctx: cp.Context) -> str:
        ctx.act("edit-1", ws, op="append", path="notes.txt", text="+line-1\n")
        ctx.act("edit-2", ws, op="append", path="notes.txt", text="+line-2 (v1)\n")
        return "done"

    return edit


def v2(ws: cp.Workspace, *, compatible: bool, patched: bool) -> cp.Workflow[Any]:
    @cp.workflow("edit", version="2", compatible_with=["1"] if compatible else [])
    def edit(ctx: cp.Context) -> str:
        ctx.act("edit-1", ws, op="append", path="notes.txt", text="+line-1\n")
        if patched and ctx.patched("v2-second-line"):
            ctx.act("edit-2", ws, op="append", path="notes.txt", text="+line-2 (v2)\n")
        else:
            ctx.act("edit-2", ws, op="append", path="notes.txt", text="+line-2 (v1)\n")
        return "done"

    return edit


def started_on_v1(
    tmp_path: Path, crash: str = "after_commit[step_done:edit-1]"
) -> tuple[str, cp.Workspace]:
    (tmp_path / "ws").mkdir()
    ws = cp.Workspace(tmp_path / "ws")
    url = f"sqlite:///{tmp_path / 'l.db'}"
    ledger = cp.Ledger(url, crash_points=cp.CrashPoints(match=crash))
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(v1(ws), run_id="r")
    ledger.close()
    return url, ws


def reference(tmp_path: Path) -> str:
    (tmp_path / "ref").mkdir()
    ws = cp.Workspace(tmp_path / "ref")
    with cp.Ledger("memory://") as ledger:
        ledger.run(v1(ws), run_id="r")
    return ws.fingerprint()


def test_v2_that_cannot_replay_v1_is_refused_naming_both(tmp_path: Path) -> None:
    url, ws = started_on_v1(tmp_path)
    before = ws.fingerprint()
    with cp.Ledger(url) as ledger, pytest.raises(cp.UnknownWorkflow) as refused:
        ledger.run(v2(ws, compatible=False, patched=True), run_id="r")
    assert "version '1'" in str(refused.value)
    assert "version '2'" in str(refused.value)
    assert ws.fingerprint() == before  # nothing executed


@pytest.mark.parametrize(
    ("patched", "crash"),
    [
        (False, "after_commit[step_done:edit-1]"),
        (False, "after_commit[act_intent:edit-2]"),
        # With a patch, only runs that passed the change point under v1 keep the v1
        # branch (one that had not reached it takes v2's: tests/unit/test_versions.py).
        (True, "after_commit[act_intent:edit-2]"),
        (True, "after_commit[step_done:edit-2]"),
    ],
)
def test_compatible_v2_finishes_v1_runs_with_the_same_artifacts(
    tmp_path: Path, patched: bool, crash: str
) -> None:
    url, ws = started_on_v1(tmp_path, crash)
    with cp.Ledger(url) as ledger:
        assert ledger.run(v2(ws, compatible=True, patched=patched), run_id="r") == "done"
        assert ledger.get_run("r").version == "1"
    assert ws.fingerprint() == reference(tmp_path)
    assert (tmp_path / "ws" / "notes.txt").read_text() == "+line-1\n+line-2 (v1)\n"
