"""The approvers registry and signed approvals work on every store (memory, SQLite,
PostgreSQL) without a store method of their own, and an operator append never races a
worker: it takes the run's lease like one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity.signing import generate_keypair

POLICY = cp.Policy(
    "ws-1",
    allow={"workspace": "*"},
    risk={"workspace": lambda tool, params: "high" if params["op"] == "delete" else "low"},
    approval_required={"high"},
)


def cleanup(ws: cp.Workspace) -> cp.Workflow[Any]:
    @cp.workflow("cleanup", version="1")
    def flow(ctx: cp.Context) -> str:
        ctx.act("note", ws, op="append", path="log.txt", text="cleaning\n")
        ctx.act("drop", ws, op="delete", path="old.txt")
        return "cleaned"

    return flow


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'l.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_approve_on_every_store(url: str, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "old.txt").write_text("x\n")
    ws = cp.Workspace(root)
    generate_keypair(tmp_path / "alice.pem")
    ledger = cp.Ledger(url)
    try:
        ledger.register_policy(POLICY)
        flow = cleanup(ws)
        with pytest.raises(cp.RunFrozen):
            ledger.run(flow, run_id="c", options=cp.RunOptions(policy=POLICY))
        ledger.add_approver("alice", (tmp_path / "alice.pem.pub").read_text())
        assert list(ledger.approvers()) == ["alice"]
        assert [info.run_id for info in ledger.runs()] == ["c"]
        ledger.approve("c", "drop", key=tmp_path / "alice.pem")
        assert ledger.resume("c") == "cleaned"
        assert not (root / "old.txt").exists()
        assert (root / "log.txt").read_text() == "cleaning\n"
        assert sorted(ledger.check()) == [("c", None), ("crashproof:approvers", None)]
    finally:
        ledger.close()


def test_reject_on_every_store(url: str, tmp_path: Path) -> None:
    """A rejection is journaled on every store; the workflow's act raises
    cp.ApprovalRejected (uncaught: the run fails), nothing deleted; the journal checks."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "old.txt").write_text("x\n")
    generate_keypair(tmp_path / "alice.pem")
    ledger = cp.Ledger(url)
    try:
        ledger.register_policy(POLICY)
        flow = cleanup(cp.Workspace(root))
        with pytest.raises(cp.RunFrozen):
            ledger.run(flow, run_id="c", options=cp.RunOptions(policy=POLICY))
        ledger.add_approver("alice", (tmp_path / "alice.pem.pub").read_text())
        assert ledger.pending_act("c")["step"] == "drop"
        ledger.reject("c", "drop", key=tmp_path / "alice.pem", reason="keep it")
        with pytest.raises(cp.ApprovalRefused):  # decided already: nothing written
            ledger.reject("c", key=tmp_path / "alice.pem", reason="twice")
        with pytest.raises(cp.RunFailed, match="keep it"):
            ledger.resume("c")
        assert (root / "old.txt").exists()
        assert sorted(ledger.check()) == [("c", None), ("crashproof:approvers", None)]
    finally:
        ledger.close()


def test_an_approval_waits_for_the_lease_of_a_live_worker(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "old.txt").write_text("x\n")
    generate_keypair(tmp_path / "alice.pem")
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.register_policy(POLICY)
    with pytest.raises(cp.RunFrozen):
        ledger.run(cleanup(cp.Workspace(root)), run_id="c", options=cp.RunOptions(policy=POLICY))
    ledger.add_approver("alice", (tmp_path / "alice.pem.pub").read_text())
    before = len(ledger._store.load_events("c"))
    ledger._store.claim("c", "another-host:1:w", 60.0, take_over=False)  # a live worker
    with pytest.raises(cp.LeaseHeld):
        ledger.approve("c", key=tmp_path / "alice.pem")
    assert len(ledger._store.load_events("c")) == before
    assert (root / "old.txt").exists()
    ledger.close()
