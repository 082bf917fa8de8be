"""The audit timeline folded from a journal: every record attributed to a worker (or an
operator) with the crashproof, workflow and policy versions of its driving session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.runtime.operations.audit import run_timeline, timeline

POLICY = cp.Policy("pol-7", allow={})


def ask(i: int) -> cp.Decision:
    return cp.Decision(i, model="m", usage={"total_tokens": 10})


@cp.workflow("audited", version="4")
def audited(ctx: cp.Context) -> list[Any]:
    return [ctx.decide(f"ask{i}", ask, i) for i in range(4)]


def _ledger(tmp_path: Path) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}")
    ledger.register(audited)
    ledger.register_policy(POLICY)
    return ledger


def test_sessions_operators_and_versions(tmp_path: Path) -> None:
    options = cp.RunOptions(limits=cp.Limits(max_tokens=10), policy=POLICY)
    first = _ledger(tmp_path)
    with pytest.raises(cp.RunStopped):
        first.run(audited, run_id="a", options=options)
    second = _ledger(tmp_path)
    with pytest.raises(cp.RunStopped):  # raised, but not enough: no drive follows
        second.resume("a", raise_budget={"tokens": 10}, by="bob")
    third = _ledger(tmp_path)
    with pytest.raises(cp.RunStopped):
        third.resume("a", raise_budget={"tokens": 20}, by="carol")
    fourth = _ledger(tmp_path)
    assert fourth.resume("a", raise_budget={"tokens": None}, by="dave") == [0, 1, 2, 3]
    entries = run_timeline(fourth, "a")
    events = fourth._store.load_events("a")
    assert [e["seq"] for e in entries] == [e.seq for e in events]
    assert [e["type"] for e in entries] == [e.type.value for e in events]
    for entry in entries:
        assert entry["crashproof"] == cp.__version__
        assert entry["workflow_version"] == "4"
        assert entry["policy_version"] == "pol-7"
    assert entries[0]["worker"] == first.worker_id  # run_started names its starter
    by_operator = {e["operator"]["by"]: e for e in entries if "operator" in e}
    # tokens=10 changed nothing and was not journaled; carol's and dave's raises were.
    assert set(by_operator) == {"carol", "dave"}
    assert by_operator["carol"]["worker"] == third.worker_id
    assert by_operator["dave"]["worker"] == fourth.worker_id
    workers = [e["worker"] for e in entries if e["type"] == "step_done"]
    assert workers == [first.worker_id, third.worker_id, fourth.worker_id, fourth.worker_id]
    sessions = [e["session"] for e in entries if e["session"] is not None]
    assert sessions == sorted(sessions)
    assert len(set(sessions)) == 3  # three drives wrote records


def test_operator_records_without_a_following_drive_keep_their_operator() -> None:
    from crashproof.journal.records import Event, EventType

    def event(seq: int, type_: EventType, payload: dict[str, Any]) -> Event:
        return Event(run_id="r", seq=seq, type=type_, key=None, payload=payload, created_at=1.0)

    session = {"worker": "w1", "crashproof": "0.1", "workflow_version": "1"}
    events = [
        event(0, EventType.RUN_STARTED, {"workflow": "x", "version": "1"}),
        event(1, EventType.STEP_DONE, {"kind": "step", "status": "succeeded", "session": session}),
        event(2, EventType.BUDGET_RAISED, {"by": "eve", "host": "h", "old": {}, "new": {}}),
    ]
    entries = timeline(events)
    assert entries[0]["worker"] is None  # a journal from before started_by
    assert entries[1]["worker"] == "w1"
    assert entries[2]["operator"] == {"by": "eve", "host": "h"}
    assert entries[2]["worker"] == "w1"
    assert timeline([]) == []
