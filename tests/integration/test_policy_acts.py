"""Policies and budgets against real targets: a workspace on disk and a target system with
its own durable state. A refused act leaves the world untouched; a budget stop never cuts
an act in half, even when the process dies right at the limit."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.port import ActSettings
from integration._targets import Target, TargetTool

FAST = ActSettings(retryable_attempts=3, lookup_attempts=2, backoff=0.0)

SCOPED = cp.Policy(
    "ws-1",
    allow={"workspace": "1"},
    scopes={"workspace": {"path": ["src/*", "README.md"]}},
    identity="agent@example.com",
    risk={"workspace": lambda tool, params: "high" if params["op"] == "delete" else "low"},
    approval_required={"high"},
)


def ledger_at(tmp_path: Path, **kw: Any) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", act_settings=FAST, **kw)
    ledger.register_policy(SCOPED)
    return ledger


def edits(ws: cp.Workspace, *paths: str) -> cp.Workflow[list[str]]:
    @cp.workflow("edits")
    def flow(ctx: cp.Context) -> list[str]:
        done = []
        for i, path in enumerate(paths):
            try:
                ctx.act(f"edit-{i}", ws, op="append", path=path, text=f"+line-{i}\n")
                done.append(f"wrote {path}")
            except cp.PolicyViolation as exc:
                done.append(f"refused {path}: {exc}")
        return done

    return flow


@pytest.fixture
def ws(tmp_path: Path) -> cp.Workspace:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "notes").mkdir()
    (root / "notes" / "secret.txt").write_text("do not touch\n")
    return cp.Workspace(root)


def test_a_write_outside_the_scope_is_refused_and_the_file_untouched(
    tmp_path: Path, ws: cp.Workspace
) -> None:
    secret = ws.root / "notes" / "secret.txt"
    flow = edits(ws, "src/a.txt", "notes/secret.txt", "../escape.txt", "README.md")
    points = cp.CrashPoints(match="before_commit[run_succeeded]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(
            flow, run_id="r", options=cp.RunOptions(policy=SCOPED)
        )
    fingerprint = ws.fingerprint()
    assert secret.read_text() == "do not touch\n"
    assert not (tmp_path / "escape.txt").exists()

    ledger = ledger_at(tmp_path)
    ledger.register(flow)
    result = ledger.resume("r")
    assert result[0] == "wrote src/a.txt"
    assert result[3] == "wrote README.md"
    assert result[1].startswith(
        "refused notes/secret.txt: act 'edit-1' refused by policy 'ws-1': "
        "path 'notes/secret.txt' is outside the workspace scope ['src/*', 'README.md']"
    )
    assert "has a '..' segment" in result[2]
    assert ws.fingerprint() == fingerprint  # the replay touched nothing
    assert (ws.root / "src" / "a.txt").read_text() == "+line-0\n"  # applied once

    events = ledger._store.load_events("r")
    for key in ("edit-1", "edit-2"):
        recorded = [e for e in events if e.key == key]
        assert [e.type for e in recorded] == [EventType.STEP_DONE]  # no intent committed
        assert recorded[0].payload["failure"] == "policy"
    info = ledger.get_run("r")
    assert info.status is cp.RunStatus.SUCCEEDED
    assert [s.failure for s in info.steps] == [None, "policy", "policy", None]


def test_a_tool_outside_the_allowlist_is_never_called(tmp_path: Path, ws: cp.Workspace) -> None:
    target = Target(tmp_path / "t.json")

    @cp.workflow("sneaky")
    def flow(ctx: cp.Context) -> Any:
        ctx.act("edit", ws, op="write", path="src/ok.txt", content="ok\n")
        return ctx.act("create", TargetTool(target), size="s")

    with pytest.raises(cp.RunFailed, match="tool 'target' is not in its allowlist"):
        ledger_at(tmp_path).run(flow, run_id="r", options=cp.RunOptions(policy=SCOPED))
    assert target.state()["executes"] == {}
    assert target.state()["lookups"] == {}
    assert (ws.root / "src" / "ok.txt").read_text() == "ok\n"
    step = ledger_at(tmp_path).get_run("r").steps[1]
    assert (step.key, step.status, step.failure) == ("create", cp.StepStatus.FAILED, "policy")


def test_a_risky_act_waits_for_approval_and_touches_nothing(
    tmp_path: Path, ws: cp.Workspace
) -> None:
    (ws.root / "src" / "old.txt").write_text("keep me\n")

    @cp.workflow("cleanup")
    def flow(ctx: cp.Context) -> str:
        ctx.act("note", ws, op="append", path="src/log.txt", text="cleaning\n")
        ctx.act("drop", ws, op="delete", path="src/old.txt")
        return "cleaned"

    with pytest.raises(cp.RunFrozen) as frozen:
        ledger_at(tmp_path).run(flow, run_id="r", options=cp.RunOptions(policy=SCOPED))
    assert frozen.value.status == "awaiting_approval"
    assert (ws.root / "src" / "old.txt").read_text() == "keep me\n"
    assert frozen.value.evidence is not None
    pending = frozen.value.evidence["pending_act"]
    assert pending["params"] == {"op": "delete", "path": "src/old.txt"}
    assert pending["policy"]["identity"] == "agent@example.com"
    ledger = ledger_at(tmp_path)
    ledger.register(flow)
    with pytest.raises(cp.RunFrozen, match="needs an approval"):
        ledger.resume("r")
    assert (ws.root / "src" / "old.txt").exists()
    assert [e.key for e in ledger._store.load_events("r") if e.type is EventType.ACT_INTENT] == [
        "note"
    ]


# -- budgets with acts in flight -------------------------------------------------


def two_creates(tool: TargetTool) -> cp.Workflow[list[Any]]:
    @cp.workflow("creates")
    def flow(ctx: cp.Context) -> list[Any]:
        first = ctx.act("create", tool, size="s")  # the last act the budget allows
        second = ctx.act("create", tool, size="m")
        return [first, second]

    return flow


@pytest.mark.parametrize(
    "point",
    [
        "after_commit[act_intent:create]",  # intent committed, tool not called yet
        "before_commit[step_done:create]",  # effect done, receipt not committed
        "after_commit[step_done:create]",  # receipt committed, stop not yet
        "before_commit[run_stopped:create#2]",  # the stop itself
    ],
)
def test_a_crash_at_the_limit_never_cuts_an_act_in_half(tmp_path: Path, point: str) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)
    flow = two_creates(tool)
    options = cp.RunOptions(limits=cp.Limits(max_steps=1))
    points = cp.CrashPoints(match=point)
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(flow, run_id="r", options=options)
    ledger = ledger_at(tmp_path)
    ledger.register(flow)
    with pytest.raises(cp.RunStopped, match="budget:steps"):
        ledger.resume("r")
    # The act in flight was reconciled (looked up, completed once), then the run stopped.
    assert target.count("executes", "r/create") == 1
    assert target.count("executes", "r/create#2") == 0
    info = ledger.get_run("r")
    assert (info.status, info.reason) == (cp.RunStatus.STOPPED, "budget:steps")
    assert [(s.key, s.status) for s in info.steps] == [("create", cp.StepStatus.SUCCEEDED)]
    # Raised: the second act runs once, the first is replayed, not repeated.
    result = ledger.resume("r", raise_budget={"steps": 2}, by="ops")
    assert result == [{"id": "rec-1"}, {"id": "rec-2"}]
    assert target.count("executes", "r/create") == 1
    assert target.count("executes", "r/create#2") == 1


def test_wall_time_spent_while_down_still_lets_the_act_in_flight_finish(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)
    flow = two_creates(tool)
    # (A second of budget: on a loaded 2-core machine the first drive took over 50 ms to
    # reach the act, and stopped on the budget before it.)
    options = cp.RunOptions(limits=cp.Limits(max_wall_seconds=1.0))
    points = cp.CrashPoints(match="after_commit[act_intent:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(flow, run_id="r", options=options)
    time.sleep(1.1)  # the process is "down" past the wall-time limit
    ledger = ledger_at(tmp_path)
    ledger.register(flow)
    with pytest.raises(cp.RunStopped, match="budget:wall_time"):
        ledger.resume("r")
    assert target.count("lookups", "r/create") == 1
    assert target.count("executes", "r/create") == 1  # finished, not abandoned
    assert target.count("executes", "r/create#2") == 0
