"""The act protocol against a target with its own durable state (a JSON file), in-process:
intents before effects, receipts after, lookup before any retry, conflicts frozen."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.runtime.port import ActSettings
from integration._targets import BlindTool, Target, TargetTool

FAST = ActSettings(retryable_attempts=3, lookup_attempts=2, backoff=0.0)


def make(tool: cp.Tool, size: str = "s") -> cp.Workflow[list[Any]]:
    @cp.workflow("acts", version="1")
    def acts(ctx: cp.Context) -> list[Any]:
        first = ctx.act("create", tool, size=size)
        second = ctx.act("create", tool, size="m")
        return [first, second]

    return acts


def ledger_at(tmp_path: Path, **kw: Any) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", act_settings=FAST, **kw)


def test_happy_path_then_replay_calls_nothing(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)
    result = ledger_at(tmp_path).run(make(tool), run_id="r")
    assert result == [{"id": "rec-1"}, {"id": "rec-2"}]
    again = ledger_at(tmp_path).run(make(tool), run_id="r")
    assert again == result
    assert target.count("executes", "r/create") == 1
    assert target.count("executes", "r/create#2") == 1
    steps = ledger_at(tmp_path).get_run("r").steps
    assert [(s.operation_id, s.status) for s in steps] == [
        ("r/create", cp.StepStatus.SUCCEEDED),
        ("r/create#2", cp.StepStatus.SUCCEEDED),
    ]
    assert len(steps[0].intent_digest or "") == 64


def test_lost_response_is_looked_up_not_resent(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    result = ledger_at(tmp_path).run(make(TargetTool(target, ["lost"])), run_id="r")
    assert result[0] == {"id": "rec-1"}
    assert target.count("executes", "r/create") == 1  # not re-sent
    assert target.count("lookups", "r/create") == 1
    assert len(target.state()["records"]) == 2


def test_timeout_with_nothing_done_executes_once_more_with_same_key(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    ledger_at(tmp_path).run(make(TargetTool(target, ["timeout"])), run_id="r")
    assert target.count("executes", "r/create") == 2  # lookup said "not found" first
    assert target.count("lookups", "r/create") == 1
    info = ledger_at(tmp_path).get_run("r")
    assert info.steps[0].attempts == 2


def test_retryable_is_retried_with_same_key_then_succeeds(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    ledger_at(tmp_path).run(make(TargetTool(target, ["retryable", "retryable"])), run_id="r")
    assert target.count("executes", "r/create") == 3
    assert len(target.state()["records"]) == 2


def test_permanent_failure_is_act_failed_and_replayed_identically(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")

    @cp.workflow("perm", version="1")
    def perm(ctx: cp.Context) -> str:
        try:
            ctx.act("create", TargetTool(target, ["permanent"]), size="s")
        except cp.ActFailed as exc:
            return f"gave up: {exc}"
        return "created"

    first = ledger_at(tmp_path).run(perm, run_id="r")
    assert first.startswith("gave up: act 'create' failed permanently: rejected: quota")
    info = ledger_at(tmp_path).get_run("r")
    assert info.steps[0].status is cp.StepStatus.FAILED
    # A new run on the same journal (e.g. after a crash before run_succeeded) replays it.
    points = cp.CrashPoints(match="before_commit[run_succeeded]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path / "..", crash_points=points).run(perm, run_id="r2")
    assert ledger_at(tmp_path / "..").run(perm, run_id="r2") == first.replace(
        "'create'", "'create'"
    )
    assert target.count("executes", "r2/create") == 1


def test_crash_after_intent_is_looked_up_first(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)
    points = cp.CrashPoints(match="after_commit[act_intent:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(make(tool), run_id="r")
    assert target.count("executes", "r/create") == 0
    assert ledger_at(tmp_path).get_run("r").steps[0].status is cp.StepStatus.RUNNING
    ledger_at(tmp_path).run(make(tool), run_id="r")
    assert target.count("lookups", "r/create") == 1
    assert target.count("executes", "r/create") == 1


def test_crash_between_effect_and_receipt_attaches_found_receipt(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(make(tool), run_id="r")
    assert ledger_at(tmp_path).run(make(tool), run_id="r")[0] == {"id": "rec-1"}
    assert target.count("executes", "r/create") == 1


def test_tool_without_lookup_is_never_reexecuted(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = BlindTool(target)
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(make(tool), run_id="r")
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger_at(tmp_path).run(make(tool), run_id="r")
    assert frozen.value.status == "needs_review"
    assert "cannot look it up" in frozen.value.reason
    assert target.count("executes", "r/create") == 1
    with pytest.raises(cp.RunFrozen):  # still frozen, still nothing executed
        ledger_at(tmp_path).run(make(tool), run_id="r")
    assert target.count("executes", "r/create") == 1
    info = ledger_at(tmp_path).get_run("r")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert (info.evidence or {}).get("operation_id") == "r/create"


def test_same_key_other_intent_freezes_with_evidence(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    state = target.state()
    state["records"]["r/create"] = {"id": "rec-x", "digest": "f" * 64}
    target.save(state)
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger_at(tmp_path).run(make(TargetTool(target, ["lost"])), run_id="r")
    assert isinstance(frozen.value.cause, cp.ReceiptConflict)
    info = ledger_at(tmp_path).get_run("r")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert info.evidence is not None
    assert info.evidence["receipt"]["intent_digest"] == "f" * 64
    assert info.evidence["intent_digest"] == info.steps[0].intent_digest != "f" * 64
    assert info.evidence["receipt"]["receipt_id"] == "rec-x"
    assert target.count("executes", "r/create#2") == 0  # nothing else executes


def test_changed_intent_for_recorded_operation_is_nondeterminism(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    ledger_at(tmp_path).run(make(TargetTool(target), size="s"), run_id="r")
    points = cp.CrashPoints(match="before_commit[run_succeeded]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(make(TargetTool(target)), run_id="r2")
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger_at(tmp_path).run(make(TargetTool(target), size="xl"), run_id="r2")
    assert isinstance(frozen.value.cause, cp.NonDeterminismError)
    assert target.count("executes", "r2/create") == 1


def test_in_flight_intent_changed_by_new_code_is_frozen(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    points = cp.CrashPoints(match="after_commit[act_intent:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(make(TargetTool(target)), run_id="r")
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger_at(tmp_path).run(make(TargetTool(target), size="xl"), run_id="r")
    assert "nothing was executed" in frozen.value.reason
    assert target.count("executes", "r/create") == 0


def test_lookup_unavailable_stops_then_a_later_resume_retries(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger_at(tmp_path, crash_points=points).run(make(TargetTool(target)), run_id="r")
    down = TargetTool(target, ["lookup-down", "lookup-down"])
    with pytest.raises(cp.RunStopped) as stopped:  # a retryable stop, not a question
        ledger_at(tmp_path).run(make(down), run_id="r")
    assert stopped.value.reason.startswith("unavailable:create: lookup unavailable")
    assert ledger_at(tmp_path).get_run("r").status is cp.RunStatus.STOPPED
    assert target.count("lookups", "r/create") == 2  # bounded
    result = ledger_at(tmp_path).run(make(TargetTool(target)), run_id="r")
    assert result[0] == {"id": "rec-1"}
    assert target.count("executes", "r/create") == 1


def test_lookup_that_cannot_tell_stops_instead_of_guessing(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger_at(tmp_path).run(make(TargetTool(target, ["timeout", "cannot-tell"])), run_id="r")
    assert "cannot tell" in frozen.value.reason
    assert target.count("executes", "r/create") == 1


@pytest.mark.parametrize(
    ("receipt", "problem"),
    [
        (cp.Receipt("", {"id": 1}), "no receipt_id"),
        (cp.Receipt("rec", {1, 2}), "not JSON"),
        ({"id": "rec"}, "expected a cp.Receipt"),
    ],
)
def test_invalid_receipt_freezes_and_is_explained(
    tmp_path: Path, receipt: Any, problem: str
) -> None:
    class Sloppy(TargetTool):
        name: ClassVar[str] = "sloppy"

        def execute(self, call: cp.Call) -> cp.Receipt:
            super().execute(call)
            return receipt  # type: ignore[no-any-return]

    target = Target(tmp_path / "t.json")
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger_at(tmp_path).run(make(Sloppy(target)), run_id="r")
    assert "invalid receipt" in frozen.value.reason
    assert problem in frozen.value.reason
    info = ledger_at(tmp_path).get_run("r")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert target.count("executes", "r/create") == 1


def test_refrozen_run_reports_the_same_cause_and_evidence(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    state = target.state()
    state["records"]["r/create"] = {"id": "rec-x", "digest": "f" * 64}
    target.save(state)
    with pytest.raises(cp.RunFrozen) as first:
        ledger_at(tmp_path).run(make(TargetTool(target, ["lost"])), run_id="r")
    with pytest.raises(cp.RunFrozen) as later:  # a new process asks again
        ledger_at(tmp_path).run(make(TargetTool(target)), run_id="r")
    assert type(later.value.cause) is type(first.value.cause) is cp.ReceiptConflict
    assert str(later.value.cause) == str(first.value.cause)
    assert later.value.evidence == first.value.evidence
    assert later.value.evidence is not None
    assert later.value.evidence["receipt"]["receipt_id"] == "rec-x"
