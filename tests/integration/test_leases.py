"""Leases and fencing on a SQLite ledger: one driver per run at a time, take-over fences
the old one out, and the fencing token reaches tools (DESIGN.md section 7)."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.store.sqlite import SQLiteStore
from integration._targets import Target, TargetTool

LedgerFactory = Callable[..., cp.Ledger]

WAIT = 10.0  # seconds: generous bounds for thread hand-offs, never reached when green


class TokenTool(TargetTool):
    """A target tool that records the fencing token of every call it executes."""

    name: ClassVar[str] = "tokens"

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.tokens: list[int | None] = []

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.tokens.append(call.fencing_token)
        return super().execute(call)


def executes(target: Target) -> int:
    return sum(target.state()["executes"].values())


class Gate:
    """A step body that blocks the first time it runs, until opened."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            if not self.opened.wait(WAIT):
                raise TimeoutError("the gate was never opened")
        return "through"


def gated_workflow(gate: Gate, tool: cp.Tool) -> cp.Workflow[Any]:
    @cp.workflow("gated")
    def workflow(ctx: cp.Context, size: str) -> Any:
        passed = ctx.step("wait", gate)
        created = ctx.act("create", tool, size=size)
        return {"passed": passed, "created": created}

    return workflow


class Driver:
    """Runs ``ledger.run`` in a thread and keeps its outcome."""

    def __init__(self, ledger: cp.Ledger, wf: cp.Workflow[Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(ledger, wf), daemon=True)
        self.thread.start()

    def _run(self, ledger: cp.Ledger, wf: cp.Workflow[Any]) -> None:
        try:
            self.result = ledger.run(wf, run_id="r", size="s")
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def test_a_second_ledger_meets_lease_held_while_the_first_drives_the_run(
    tmp_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    gate = Gate()
    wf = gated_workflow(gate, TargetTool(target))
    first, second = open_ledger(), open_ledger()
    second.register(wf)
    driver = Driver(first, wf)
    assert gate.entered.wait(WAIT)

    with pytest.raises(cp.LeaseHeld, match=f"owned by worker {first.worker_id} until ") as held:
        second.resume("r")
    assert held.value.owner == first.worker_id
    assert held.value.expires_at is not None
    assert held.value.expires_at > time.time()
    with pytest.raises(cp.LeaseHeld):
        second.run(wf, run_id="r", size="s")  # the same through run()

    gate.opened.set()
    driver.join()
    assert driver.error is None
    assert driver.result["passed"] == "through"
    assert (gate.calls, executes(target)) == (1, 1)
    # The lease was released when the run ended: the other Ledger may read it at once.
    assert second.resume("r") == driver.result
    assert executes(target) == 1


def test_the_lease_is_renewed_while_a_long_step_runs(
    tmp_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    gate = Gate()
    wf = gated_workflow(gate, TargetTool(target))
    first, second = open_ledger(lease_seconds=0.3), open_ledger()
    second.register(wf)
    driver = Driver(first, wf)
    assert gate.entered.wait(WAIT)
    time.sleep(0.8)  # well past one lease: only the heartbeat keeps it
    with pytest.raises(cp.LeaseHeld):
        second.resume("r")
    gate.opened.set()
    driver.join()
    assert driver.error is None


def test_an_expired_lease_of_a_crashed_run_is_taken_over_without_take_over(
    tmp_path: Path, db_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    tool = TokenTool(target)
    gate = Gate()
    gate.opened.set()
    wf = gated_workflow(gate, tool)
    crashing = open_ledger(
        lease_seconds=0.2, crash_points=cp.CrashPoints(match="before_commit[step_done:wait]")
    )
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(wf, run_id="r", size="s")
    # A crash releases nothing: the lease stays in the ledger until it expires.
    with sqlite3.connect(db_path) as conn:
        held = conn.execute("SELECT owner, fencing_token FROM runs").fetchone()
    conn.close()
    assert held == (crashing.worker_id, 1)
    time.sleep(0.3)

    resumed = open_ledger()
    resumed.register(wf)
    result = resumed.resume("r")
    assert result["passed"] == "through"
    assert executes(target) == 1
    assert tool.tokens == [2]  # the crashed owner had token 1
    assert resumed.get_run("r").status is cp.RunStatus.SUCCEEDED


def _started_run(open_ledger: LedgerFactory, tool: cp.Tool) -> cp.Workflow[Any]:
    """A run "r" that exists and did nothing yet (queued), and no lease on it."""
    gate = Gate()
    gate.opened.set()
    wf = gated_workflow(gate, tool)
    open_ledger().enqueue(wf, run_id="r", size="s")
    return wf


def test_a_run_is_created_held_by_its_drive_and_a_crash_right_after_leaves_the_lease(
    tmp_path: Path, db_path: Path, open_ledger: LedgerFactory
) -> None:
    # Its first lease is written with the run (no claim after it): another worker never
    # sees the new run unowned, and a crash right after the start leaves the lease as a
    # dead process's, taken over at once in this process (abandoned).
    target = Target(tmp_path / "t.json")
    gate = Gate()
    gate.opened.set()
    wf = gated_workflow(gate, TargetTool(target))
    crashing = open_ledger(crash_points=cp.CrashPoints(match="after_commit[run_started]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(wf, run_id="r", size="s")
    store = SQLiteStore(db_path)
    try:
        with pytest.raises(cp.LeaseHeld):
            store.claim("r", "elsewhere:1:abcd", 60.0)
    finally:
        store.close()
    ledger = open_ledger()
    ledger.register(wf)
    assert ledger.resume("r")["passed"] == "through"
    assert executes(target) == 1
    # The crashed drive wrote nothing after the start: the resume's session is the first.
    receipts = lease_receipts(ledger)
    assert [(r["token"], r["decision"]) for r in receipts] == [(2, "abandoned in this process")]


def test_a_live_lease_of_another_host_blocks_until_it_expires(
    tmp_path: Path, db_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    tool = TokenTool(target)
    wf = _started_run(open_ledger, tool)
    store = SQLiteStore(db_path)
    try:
        foreign = store.claim("r", "elsewhere:1:abcd", 0.5)
    finally:
        store.close()
    ledger = open_ledger()
    ledger.register(wf)
    with pytest.raises(cp.LeaseHeld, match="owned by worker elsewhere:1:abcd until "):
        ledger.resume("r")
    assert executes(target) == 0
    time.sleep(0.6)
    assert ledger.resume("r")["passed"] == "through"
    assert tool.tokens == [foreign.token + 1]


def test_the_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(
    tmp_path: Path, db_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    wf = _started_run(open_ledger, TargetTool(target))
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = f"{socket.gethostname()}:{int(child.stdout)}:dead"
    store = SQLiteStore(db_path)
    try:
        store.claim("r", dead, 60.0)
    finally:
        store.close()
    ledger = open_ledger()
    ledger.register(wf)
    assert ledger.resume("r")["passed"] == "through"
    assert executes(target) == 1


def test_take_over_fences_the_old_holder_out_before_any_further_effect(
    tmp_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    gate = Gate()
    tool = TokenTool(target)
    wf = gated_workflow(gate, tool)
    old, new = open_ledger(), open_ledger()
    new.register(wf)
    driver = Driver(old, wf)
    assert gate.entered.wait(WAIT)

    with pytest.raises(cp.LeaseHeld):
        new.resume("r")
    result = new.resume("r", take_over=True)  # the gate lets the second call through
    assert result["passed"] == "through"
    journal = new.get_run("r")
    assert journal.status is cp.RunStatus.SUCCEEDED
    assert (executes(target), tool.tokens) == (1, [2])

    gate.opened.set()  # the old holder's step returns; its commit must be refused
    driver.join()
    assert isinstance(driver.error, cp.StaleLeaseError)
    assert new.get_run("r") == journal  # nothing of the old holder was kept
    assert (executes(target), tool.tokens) == (1, [2])  # and no further tool call


def test_the_fencing_token_reaches_tools_and_grows_with_each_new_owner(
    tmp_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    tool = TokenTool(target)

    @cp.workflow("two-acts")
    def wf(ctx: cp.Context) -> list[Any]:
        first = ctx.act("first", tool, size="s")
        ctx.step("between", lambda: 1)
        second = ctx.act("second", tool, size="m")
        return [first, second]

    crashing = open_ledger(crash_points=cp.CrashPoints(match="before_commit[step_done:between]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(wf, run_id="r")
    assert tool.tokens == [1]

    resumed = open_ledger()  # a new owner: the crashed one is not driving the run any more
    resumed.register(wf)
    resumed.resume("r")
    assert tool.tokens == [1, 2]

    later = open_ledger()
    later.register(wf)
    later.resume("r", take_over=True)  # an ended run: replayed, no tool call
    assert tool.tokens == [1, 2]
    assert executes(target) == 2


def test_two_threads_of_one_ledger_never_drive_one_run(tmp_path: Path) -> None:
    """One Ledger shared by threads: the second driver is refused while the first is
    inside a tool's execute, so the act cannot be looked up empty and executed twice."""
    inside, release = threading.Event(), threading.Event()
    executes: list[str] = []

    class Slow(cp.Tool):
        name: ClassVar[str] = "slow"

        def execute(self, call: cp.Call) -> cp.Receipt:
            executes.append(call.operation_id)
            inside.set()
            release.wait(5)
            return cp.Receipt("r1", {"ok": True})

        def lookup(self, call: cp.Call) -> cp.Receipt | None:
            return None

    @cp.workflow("slow", version="1")
    def slow(ctx: cp.Context) -> object:
        return ctx.act("call", Slow())

    shared = cp.Ledger(f"sqlite:///{tmp_path / 'shared.db'}")
    first = threading.Thread(target=lambda: shared.run(slow, run_id="s"))
    first.start()
    if not inside.wait(5):
        raise RuntimeError("the first driver never reached execute")
    with pytest.raises(cp.LeaseHeld, match="another thread"):
        shared.run(slow, run_id="s")
    release.set()
    first.join(5)
    assert executes == ["s/call"]
    assert shared.run(slow, run_id="s") == {"ok": True}


# -- lease receipts (003: resume_lease_receipt) ---------------------------------------


def lease_receipts(ledger: cp.Ledger, run_id: str = "r") -> list[dict[str, Any]]:
    """The lease receipt of every drive that wrote something, in journal order."""
    sessions = [e.payload.get("session") for e in ledger.journal(run_id)]
    return [s["lease"] for s in sessions if isinstance(s, dict) and "lease" in s]


def _foreign_lease(db_path: Path, owner: str, ttl: float) -> None:
    store = SQLiteStore(db_path)
    try:
        store.claim("r", owner, ttl)
    finally:
        store.close()


def test_a_new_run_records_a_new_lease(tmp_path: Path, open_ledger: LedgerFactory) -> None:
    gate = Gate()
    gate.opened.set()
    ledger = open_ledger()
    ledger.run(gated_workflow(gate, TargetTool(Target(tmp_path / "t.json"))), run_id="r", size="s")
    (receipt,) = lease_receipts(ledger)
    assert receipt == {
        "lease_id": "r@1",
        "owner": ledger.worker_id,
        "previous_owner": None,
        "previous_token": 0,
        "token": 1,
        "expires_at": receipt["expires_at"],
        "decision": "new",
    }
    assert receipt["expires_at"] > time.time()


def test_a_takeover_of_a_dead_process_records_who_was_fenced_out_and_why(
    tmp_path: Path, db_path: Path, open_ledger: LedgerFactory
) -> None:
    # Before: the lease row was overwritten and the journal named the new session only.
    wf = _started_run(open_ledger, TargetTool(Target(tmp_path / "t.json")))
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = f"{socket.gethostname()}:{int(child.stdout)}:dead"
    _foreign_lease(db_path, dead, 60.0)
    ledger = open_ledger()
    ledger.register(wf)
    ledger.resume("r")
    (receipt,) = lease_receipts(ledger)
    assert (receipt["previous_owner"], receipt["previous_token"]) == (dead, 1)
    assert (receipt["token"], receipt["lease_id"]) == (2, "r@2")
    assert receipt["decision"] == f"dead pid {int(child.stdout)}"
    from crashproof.runtime.operations.audit import run_timeline

    summaries = [e["summary"] for e in run_timeline(ledger, "r") if "lease" in e]
    assert summaries[0].startswith(f"lease 2 (dead pid {int(child.stdout)}; before: {dead}")


@pytest.mark.parametrize(
    ("ttl", "take_over", "decision"),
    [(0.3, False, "expired"), (60.0, True, "take-over requested")],
)
def test_an_expired_or_requested_takeover_says_so(
    tmp_path: Path,
    db_path: Path,
    open_ledger: LedgerFactory,
    ttl: float,
    take_over: bool,
    decision: str,
) -> None:
    wf = _started_run(open_ledger, TargetTool(Target(tmp_path / "t.json")))
    _foreign_lease(db_path, "elsewhere:1:abcd", ttl)
    if not take_over:
        time.sleep(ttl + 0.1)
    ledger = open_ledger()
    ledger.register(wf)
    ledger.resume("r", take_over=take_over)
    (receipt,) = lease_receipts(ledger)
    assert (receipt["previous_owner"], receipt["decision"]) == ("elsewhere:1:abcd", decision)


def test_a_drive_that_crashed_in_this_process_is_taken_over_as_abandoned(
    tmp_path: Path, open_ledger: LedgerFactory
) -> None:
    target = Target(tmp_path / "t.json")
    gate = Gate()
    gate.opened.set()
    wf = gated_workflow(gate, TargetTool(target))
    first = open_ledger(crash_points=cp.CrashPoints(match="after_commit[step_done:wait]"))
    with pytest.raises(cp.SimulatedCrash):
        first.run(wf, run_id="r", size="s")
    second = open_ledger()
    second.register(wf)
    second.resume("r")  # takes the crashed drive's lease over (abandoned in this process)
    third = open_ledger()
    third.register(wf)
    third.resume("r")  # the run ended: answers from its journal, writes nothing
    decisions = [r["decision"] for r in lease_receipts(third)]
    assert decisions == ["new", "abandoned in this process"]
