"""Defects found in review, each pinned by the scenario that exposed it."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import ClassVar

import pytest

import crashproof as cp
from integration._targets import Target, TargetTool


def ledger(tmp_path: Path, point: str | None = None) -> cp.Ledger:
    points = cp.CrashPoints(match=point) if point else None
    return cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points)


def test_os_errors_replay_as_their_own_type(tmp_path: Path) -> None:
    missing = tmp_path / "config.toml"

    @cp.workflow("config", version="1")
    def config(ctx: cp.Context) -> str:
        try:
            return ctx.step("read", lambda: missing.read_text())
        except FileNotFoundError as exc:
            return f"defaults ({exc.filename})"

    with pytest.raises(cp.SimulatedCrash):
        ledger(tmp_path, "before_commit[run_succeeded]").run(config, run_id="c")
    assert ledger(tmp_path).run(config, run_id="c") == f"defaults ({missing})"


def test_decision_usage_and_cost_are_checked_before_anything_is_sealed(tmp_path: Path):
    for bad in (
        cp.Decision("x", cost="$0.01"),  # type: ignore[arg-type]
        cp.Decision("x", usage=[1, 2]),  # type: ignore[arg-type]
        cp.Decision("x", cost=float("inf")),
    ):

        @cp.workflow("bad", version="1")
        def bad_flow(ctx: cp.Context, decision: cp.Decision = bad) -> object:
            return ctx.decide("plan", lambda: decision)

        led = ledger(tmp_path)
        with pytest.raises(cp.SerializationError):
            led.run(bad_flow, run_id=f"b{id(bad)}")
        assert led.runs()  # the ledger stays readable


def test_workspace_refuses_a_symlink_out(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "ws" / "docs").symlink_to(tmp_path / "outside")
    ws = cp.Workspace(tmp_path / "ws")

    @cp.workflow("escape", version="1")
    def escape(ctx: cp.Context) -> str:
        try:
            ctx.act("w", ws, op="write", path="docs/pwned.txt", content="x")
        except cp.ActFailed as exc:
            return str(exc)
        return "written"

    assert "symlink" in ledger(tmp_path).run(escape, run_id="e")
    assert list((tmp_path / "outside").iterdir()) == []


def test_workspace_keeps_the_executable_bit(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    script = tmp_path / "ws" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    ws = cp.Workspace(tmp_path / "ws")
    before = ws.fingerprint(include=["*.sh"])

    @cp.workflow("append", version="1")
    def append(ctx: cp.Context) -> object:
        return ctx.act("a", ws, op="append", path="run.sh", text="echo hi\n")

    ledger(tmp_path).run(append, run_id="a")
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755
    assert ws.fingerprint(include=["*.sh"]) != before  # the content changed


def test_patched_is_false_when_the_journal_ends_inside_an_old_act(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)

    @cp.workflow("pay", version="1")
    def pay_v1(ctx: cp.Context) -> object:
        return ctx.act("pay", tool, to="old")

    with pytest.raises(cp.SimulatedCrash):
        ledger(tmp_path, "after_commit[act_intent:pay]").run(pay_v1, run_id="p")

    @cp.workflow("pay", version="1")
    def pay_v2(ctx: cp.Context) -> object:
        if ctx.patched("new-payee"):
            return ctx.act("pay", tool, to="new")
        return ctx.act("pay", tool, to="old")

    assert ledger(tmp_path).run(pay_v2, run_id="p") == {"id": "rec-1"}
    assert target.count("executes", "p/pay") == 1


def test_lookup_not_implemented_is_not_retried_forever(tmp_path: Path) -> None:
    class ExecuteOnly(cp.Tool):
        name: ClassVar[str] = "execute-only"

        def execute(self, call: cp.Call) -> cp.Receipt:
            raise TimeoutError("no answer")

    @cp.workflow("once", version="1")
    def once(ctx: cp.Context) -> object:
        return ctx.act("x", ExecuteOnly())

    for _ in range(2):
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger(tmp_path).run(once, run_id="o")
        assert "does not implement lookup" in frozen.value.reason
    events = ledger(tmp_path).get_run("o")
    assert events.status is cp.RunStatus.NEEDS_REVIEW
