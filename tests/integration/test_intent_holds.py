"""No new key around an unknown outcome (#28 item 4): a run whose act repeats an intent
that another run left in flight, unknown or frozen waits (a retryable stop, nothing
sent or journaled of the act) instead of executing it under its own operation id,
naming that run; an operator's journaled override lets it pass. Before, run B executed
the effect a second time (the first tests below fail so on the old code: two records on
the target for one intent). A worker resuming the waiting run on its own:
tests/integration/test_intent_hold_waits.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.operations.audit import run_timeline
from crashproof.runtime.port import ActSettings
from crashproof.store.queue import retryable_stop
from integration._targets import Target, TargetTool

FAST = ActSettings(retryable_attempts=2, lookup_attempts=1, backoff=0.0)


def make(tool: cp.Tool) -> cp.Workflow[Any]:
    @cp.workflow("orders", version="1")
    def orders(ctx: cp.Context, customer: str) -> Any:
        ctx.step("prepare", lambda: customer)
        return ctx.act("create", tool, customer=customer, amount=100)

    return orders


def ledger(
    tmp_path: Path, points: cp.CrashPoints | None = None, target: Target | None = None
) -> cp.Ledger:
    """The ledger; with ``target``, the workflow over it registered (to resume runs)."""
    opened = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", act_settings=FAST, crash_points=points)
    if target is not None:
        opened.register(make(TargetTool(target)))
    return opened


def crash_in_flight(tmp_path: Path, target: Target) -> None:
    """Run A: the effect committed on the target, the process died before the receipt."""
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger(tmp_path, points).run(make(TargetTool(target)), run_id="A", customer="c1")


def leave_unknown(tmp_path: Path, target: Target) -> None:
    """Run A: the response was lost and the lookup is down: unknown, stopped retryable."""
    tool = TargetTool(target, ["lost", "lookup-down"])
    with pytest.raises(cp.RunStopped, match="lookup unavailable"):
        ledger(tmp_path).run(make(tool), run_id="A", customer="c1")


def leave_for_review(tmp_path: Path, target: Target) -> None:
    """Run A: the response was lost and the target cannot tell: frozen for review."""
    tool = TargetTool(target, ["lost", "cannot-tell"])
    with pytest.raises(cp.RunFrozen, match="cannot tell"):
        ledger(tmp_path).run(make(tool), run_id="A", customer="c1")


LEFT: dict[str, Callable[[Path, Target], None]] = {
    "in flight": crash_in_flight,
    "unknown": leave_unknown,
    "frozen": leave_for_review,
}


@pytest.mark.parametrize("left", sorted(LEFT))
def test_a_new_run_waits_on_an_intent_another_run_left_unresolved(
    tmp_path: Path, left: str
) -> None:
    target = Target(tmp_path / "t.json")
    LEFT[left](tmp_path, target)
    assert len(target.state()["records"]) == 1  # A's effect happened
    with pytest.raises(cp.RunStopped) as stopped:
        ledger(tmp_path).run(make(TargetTool(target)), run_id="B", customer="c1")
    # Not executed again under B's key: still A's one record, and B's act never started.
    assert len(target.state()["records"]) == 1
    assert target.count("executes", "B/create") == 0
    reason = str(stopped.value.reason)
    assert reason.startswith("unavailable:create: waiting for another run: run 'A' holds")
    assert "run 'A' holds the same intent unresolved (act 'create'" in reason
    assert "since 20" in reason  # an ISO time
    assert "--override-intent A" in reason
    assert "--override-intent A --by NAME" in stopped.value.detail
    info = ledger(tmp_path).get_run("B")
    assert info.status is cp.RunStatus.STOPPED
    assert retryable_stop(info.status.value, info.reason)  # a worker resumes it
    events = ledger(tmp_path).journal("B")
    assert not [e for e in events if e.type is EventType.ACT_INTENT]
    assert not [e for e in events if e.type is EventType.RUN_FROZEN]
    [stop] = [e for e in events if e.type is EventType.RUN_STOPPED]
    assert stop.key == "create"
    evidence = stop.payload["evidence"]
    assert [h["run_id"] for h in evidence["intent_held"]["holders"]] == ["A"]
    assert evidence["next_step"] == "create"
    assert "unavailable" not in evidence  # releases nothing, no attempt of the act's


def test_once_the_holder_is_resolved_the_waiting_run_goes_on(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    crash_in_flight(tmp_path, target)
    with pytest.raises(cp.RunStopped):
        ledger(tmp_path).run(make(TargetTool(target)), run_id="B", customer="c1")
    with pytest.raises(cp.RunStopped, match="run 'A' holds"):  # still held: it waits again
        ledger(tmp_path, target=target).resume("B")
    assert ledger(tmp_path).store.unresolved_intents()[0].run_id == "A"
    ledger(tmp_path, target=target).resume("A")  # reconciled: lookup finds A's effect, no new one
    assert target.count("executes", "A/create") == 1
    assert ledger(tmp_path).store.unresolved_intents() == []
    result = ledger(tmp_path, target=target).resume("B")  # a new operation, now that A's is known
    assert result == {"id": "rec-2"}
    assert ledger(tmp_path).get_run("B").status is cp.RunStatus.SUCCEEDED


def test_other_params_and_completed_acts_hold_nothing(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)
    crash_in_flight(tmp_path, target)
    ledger(tmp_path).run(make(tool), run_id="C", customer="c2")  # another intent
    ledger(tmp_path, target=target).resume("A")
    ledger(tmp_path).run(make(tool), run_id="D", customer="c1")  # A's act completed
    assert len(target.state()["records"]) == 3


def test_the_holders_own_resume_is_never_refused(tmp_path: Path) -> None:
    # B passed A by an override, so both hold the intent: A's reconciliation still runs.
    target = Target(tmp_path / "t.json")
    crash_in_flight(tmp_path, target)
    with pytest.raises(cp.RunStopped):
        ledger(tmp_path).run(make(TargetTool(target)), run_id="B", customer="c1")
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger(tmp_path, points, target).resume("B", override_intent=["A"], by="alice")
    assert sorted(h.run_id for h in ledger(tmp_path).store.unresolved_intents()) == ["A", "B"]
    assert ledger(tmp_path, target=target).resume("A") == {"id": "rec-1"}
    assert ledger(tmp_path, target=target).resume("B") == {"id": "rec-2"}
    assert target.count("executes", "A/create") == 1
    assert target.count("executes", "B/create") == 1


def test_an_operator_override_is_journaled_and_passes_only_the_named_run(
    tmp_path: Path,
) -> None:
    target = Target(tmp_path / "t.json")
    crash_in_flight(tmp_path, target)
    tool = TargetTool(target)
    with pytest.raises(cp.RunStopped):
        ledger(tmp_path).run(make(tool), run_id="B", customer="c1")
    with pytest.raises(cp.CrashproofError, match="not by Z"):
        ledger(tmp_path, target=target).resume("B", override_intent=["Z"], by="alice")
    resumed = ledger(tmp_path, target=target).resume("B", override_intent=["A"], by="alice")
    assert resumed == {"id": "rec-2"}
    events = ledger(tmp_path).journal("B")
    [override] = [e for e in events if e.type is EventType.INTENT_OVERRIDE]
    assert override.key == "create"
    assert override.payload["by"] == "alice"
    assert override.payload["holders"] == ["A"]
    assert [h["run_id"] for h in override.payload["held"]] == ["A"]
    [intent] = [e for e in events if e.type is EventType.ACT_INTENT]
    assert intent.payload["overrides"] == ["A"]
    assert intent.seq > override.seq
    # A third run is held by both A and B (B's act ended: only A now) and not by the
    # override B got: overrides are per run and per act.
    with pytest.raises(cp.RunStopped, match="run 'A' holds"):
        ledger(tmp_path).run(make(tool), run_id="C", customer="c1")
    timeline = run_timeline(ledger(tmp_path), "B")
    [entry] = [t for t in timeline if t["type"] == "intent_override"]
    assert entry["operator"]["by"] == "alice"
    assert "run(s) A hold its intent unresolved" in entry["summary"]


def test_an_override_of_a_run_not_waiting_on_a_held_intent_is_refused(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    leave_for_review(tmp_path, target)
    with pytest.raises(cp.CrashproofError, match="not waiting on an intent another run holds"):
        ledger(tmp_path, target=target).resume("A", override_intent=["B"], by="alice")
    events = ledger(tmp_path).journal("A")
    assert not [e for e in events if e.type is EventType.INTENT_OVERRIDE]


def test_a_replayed_act_asks_the_index_nothing(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool = TargetTool(target)
    ledger(tmp_path).run(make(tool), run_id="A", customer="c1")
    crash_in_flight_other = cp.CrashPoints(match="before_commit[step_done:create]")
    with pytest.raises(cp.SimulatedCrash):
        ledger(tmp_path, crash_in_flight_other).run(make(tool), run_id="X", customer="c9")
    # Replaying A (completed) appends nothing, so it meets no hold, even a foreign one.
    assert ledger(tmp_path).run(make(tool), run_id="A", customer="c1") == {"id": "rec-1"}
    assert [h.run_id for h in ledger(tmp_path).store.unresolved_intents()] == ["X"]


def test_two_workspaces_are_two_instances(tmp_path: Path) -> None:
    @cp.workflow("notes", version="1")
    def notes(ctx: cp.Context, root: str) -> Any:
        return ctx.act("note", cp.Workspace(root), op="append", path="n.txt", text="+1\n")

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    points = cp.CrashPoints(match="before_commit[step_done:note]")
    with pytest.raises(cp.SimulatedCrash):
        ledger(tmp_path, points).run(notes, run_id="W1", root=str(one))
    ledger(tmp_path).run(notes, run_id="W2", root=str(two))  # the same params elsewhere
    with pytest.raises(cp.RunStopped, match="run 'W1' holds"):
        ledger(tmp_path).run(notes, run_id="W3", root=str(one))
    assert (one / "n.txt").read_text() == "+1\n"


def test_a_moved_run_holds_its_intent_where_it_is_imported(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    crash_in_flight(tmp_path, target)
    document = ledger(tmp_path).export_run("A", by="ops")
    # Still held here: A's act may be unresolved where it goes (this ledger cannot see).
    assert [h.run_id for h in ledger(tmp_path).store.unresolved_intents()] == ["A"]
    there = tmp_path / "there"
    there.mkdir()
    ledger(there).import_run(document, by="ops")
    assert [(h.run_id, h.key) for h in ledger(there).store.unresolved_intents()] == [
        ("A", "create")
    ]
    with pytest.raises(cp.RunStopped, match="run 'A' holds"):
        ledger(there).run(make(TargetTool(target)), run_id="B", customer="c1")
    assert len(target.state()["records"]) == 1


def test_a_live_act_with_no_holder_observes_as_before(tmp_path: Path) -> None:
    # Observed once before the intent and once after the receipt, nothing more.
    class Observed(TargetTool):
        observes = 0

        def observe(self) -> cp.Observation:
            Observed.observes += 1
            return cp.Observation("target:t", "f")

    target = Target(tmp_path / "t.json")
    ledger(tmp_path).run(make(Observed(target)), run_id="A", customer="c1")
    assert Observed.observes == 2  # before the intent, after the receipt


def test_on_postgresql_a_new_run_waits_on_a_held_intent(pg_url: str, tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with cp.Ledger(pg_url, crash_points=points) as crashing, pytest.raises(cp.SimulatedCrash):
        crashing.run(make(TargetTool(target)), run_id="A", customer="c1")
    with cp.Ledger(pg_url) as pg:
        with pytest.raises(cp.RunStopped, match="run 'A' holds the same intent unresolved"):
            pg.run(make(TargetTool(target)), run_id="B", customer="c1")
        assert target.count("executes", "B/create") == 0
        pg.register(make(TargetTool(target)))
        pg.resume("A")
        assert pg.resume("B") == {"id": "rec-2"}
    assert len(target.state()["records"]) == 2


def test_an_async_run_waits_on_a_held_intent_as_a_sync_one_does(tmp_path: Path) -> None:
    """The async shell commits an intent before its execute handoff; the store's refusal
    there stops the act the same way, and the journal goes on at the same seq."""
    import asyncio

    from integration.test_async import AsyncTargetTool

    target = Target(tmp_path / "t.json")
    crash_in_flight(tmp_path, target)
    tool = AsyncTargetTool(target)

    @cp.workflow("orders", version="1")
    async def orders(ctx: cp.AsyncContext, customer: str) -> Any:
        await ctx.step("prepare", lambda: customer)
        return await ctx.act("create", tool, customer=customer, amount=100)

    with ledger(tmp_path) as opened, pytest.raises(cp.RunStopped) as stopped:
        asyncio.run(opened.run_async(orders, run_id="B", customer="c1"))
    assert "run 'A' holds the same intent unresolved" in stopped.value.reason
    assert target.count("executes", "B/create") == 0
    events = ledger(tmp_path).journal("B")
    assert [e.type for e in events] == [
        EventType.RUN_STARTED,
        EventType.STEP_DONE,
        EventType.RUN_STOPPED,
    ]
    assert [e.seq for e in events] == [0, 1, 2]
    assert "session" in events[1].payload  # the drive's first record names its session


def test_on_postgresql_async_runs_in_one_batch_only_the_held_intent_waits(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many async drives on one loop commit their intents in shared batches (the hold
    checked in the batch's statement): the run whose intent another run holds stops to
    wait, executing nothing, while the others' records commit and their acts run."""
    import asyncio

    from integration.test_async import AsyncTargetTool

    target = Target(tmp_path / "t.json")
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with cp.Ledger(pg_url, crash_points=points) as crashing, pytest.raises(cp.SimulatedCrash):
        crashing.run(make(TargetTool(target)), run_id="A", customer="c1")  # holds c1
    tool = AsyncTargetTool(target)

    @cp.workflow("orders", version="1")
    async def orders(ctx: cp.AsyncContext, customer: str) -> Any:
        await ctx.step("prepare", lambda: customer)
        return await ctx.act("create", tool, customer=customer, amount=100)

    others = [f"c{k}" for k in range(2, 12)]
    from crashproof.store.pg_batch import PostgresBatchAppend

    holds_batched: list[int] = []  # per batch: the new holds it carried
    trip = PostgresBatchAppend._batch_trip

    def counted(self: Any, plans: Any, synchronous: str) -> Any:
        holds_batched.append(sum(1 for p in plans for s in p.statements if s[3] is not None))
        return trip(self, plans, synchronous)

    monkeypatch.setattr(PostgresBatchAppend, "_batch_trip", counted)

    async def all_runs(pg: cp.Ledger) -> list[Any]:
        runs = [pg.run_async(orders, run_id="B", customer="c1")]
        runs += [pg.run_async(orders, run_id=f"R{c}", customer=c) for c in others]
        return await asyncio.gather(*runs, return_exceptions=True)

    with cp.Ledger(pg_url, act_settings=FAST) as pg:
        results = asyncio.run(all_runs(pg))
        stopped = results[0]
        assert isinstance(stopped, cp.RunStopped)
        assert "run 'A' holds the same intent unresolved" in str(stopped.reason)
        assert all(isinstance(r, dict) for r in results[1:]), results
        assert target.count("executes", "B/create") == 0
        assert all(target.count("executes", f"R{c}/create") == 1 for c in others)
        assert not [e for e in pg.journal("B") if e.type is EventType.ACT_INTENT]
        held = {(h.run_id, h.key) for h in pg.store.unresolved_intents()}
        assert held == {("A", "create")}  # the others' holds were released by their ends
    assert max(holds_batched) > 1  # several runs' intents shared a batch
