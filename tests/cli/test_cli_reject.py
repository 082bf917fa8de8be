"""`crashproof reject`: a signed, journaled "no" to a pending act. The workflow gets
``cp.ApprovalRefused`` with the reason where the act stood, and the act never executes;
bad input is one line, a documented exit code, and nothing written."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import ExitCode
from crashproof.integrity.signing import verify_statement
from crashproof.journal.records import EventType

Cli = Callable[..., Any]

FLOWS = """
import crashproof as cp

POLICY = cp.Policy(
    "ops-1",
    allow={"workspace": "*"},
    risk={"workspace": lambda tool, params: "high" if params["op"] == "delete" else "low"},
    approval_required={"high"},
)
WS = cp.Workspace("ws")


@cp.workflow("careful", version="1")
def careful(ctx):
    try:
        ctx.act("drop", WS, op="delete", path="old.txt")
    except cp.ApprovalRefused as exc:
        return {"refused": str(exc)}
    return "dropped"


@cp.workflow("blunt", version="1")
def blunt(ctx):
    ctx.act("drop", WS, op="delete", path="old.txt")
    return "dropped"
"""


@pytest.fixture
def flows(project: Path) -> Iterator[Any]:
    (project / "rejectflows.py").write_text(FLOWS, encoding="utf-8")
    (project / "ws").mkdir()
    (project / "ws" / "old.txt").write_text("keep me\n")
    sys.path.insert(0, str(project))
    yield importlib.import_module("rejectflows")
    sys.modules.pop("rejectflows", None)


def _frozen(db: str, flows: Any, flow: Any, run_id: str) -> None:
    with cp.Ledger(db) as ledger, pytest.raises(cp.RunFrozen):
        ledger.run(flow, run_id=run_id, options=cp.RunOptions(policy=flows.POLICY))


def test_a_rejection_is_signed_journaled_and_raised_in_the_workflow(
    cli: Cli, project: Path, flows: Any
) -> None:
    db = f"sqlite:///{project / 'runs.db'}"
    _frozen(db, flows, flows.careful, "r1")
    assert cli("operator", "init", "--name", "alice", "--db", db).code == ExitCode.OK

    no_reason = cli("reject", "r1", "--db", db)
    assert no_reason.code == ExitCode.USAGE
    assert "needs a reason" in no_reason.err
    done = cli("reject", "r1", "drop", "--reason", "not <b>today</b>", "--db", db)
    assert done.code == ExitCode.OK, done.err
    assert "rejected r1/drop as alice: not <b>today</b>" in done.err

    with cp.Ledger(db) as ledger:
        assert ledger.get_run("r1").status.value == "running"
        events = ledger.journal("r1")
        (rejected,) = [e for e in events if e.type is EventType.APPROVAL_REJECTED]
        document = rejected.payload["rejection"]
        pem = ledger.approvers()["alice"].public_key
        assert verify_statement(pem, document["statement"], document["signature"])
        assert document["statement"]["reason"] == "not <b>today</b>"
        length = len(events)

    again = cli("reject", "r1", "--reason", "twice", "--db", db)  # decided already
    assert again.code == ExitCode.CONFLICT
    assert "not awaiting approval" in again.err
    assert len(again.err.strip().splitlines()) <= 2
    assert "Traceback" not in again.err
    missing = cli("reject", "nope", "--reason", "x", "--db", db)
    assert missing.code == ExitCode.USAGE
    with cp.Ledger(db) as ledger:
        assert len(ledger.journal("r1")) == length  # the refusals wrote nothing

    resumed = cli("resume", "r1", "--app", "rejectflows", "--db", db)
    assert resumed.code == ExitCode.OK, resumed.err
    shown = cli("show", "r1", "--json", "--db", db).json()
    assert "rejected by alice: not <b>today</b>" in shown["result"]["refused"]
    assert (project / "ws" / "old.txt").exists()  # never executed
    (human,) = shown["humans"]
    assert (human["decision"], human["reason"]) == ("reject", "not <b>today</b>")
    with cp.Ledger(db) as ledger:
        (step,) = [e for e in ledger.journal("r1") if e.type is EventType.STEP_DONE]
        assert (step.payload["failure"], step.payload["rejected"]["approver"]) == (
            "rejected",
            "alice",
        )
    # Resumed again, the recorded outcome replays: the same result, nothing executed.
    assert cli("resume", "r1", "--app", "rejectflows", "--db", db).code == ExitCode.OK
    assert (project / "ws" / "old.txt").exists()


def test_uncaught_the_run_fails_with_the_reason(cli: Cli, project: Path, flows: Any) -> None:
    db = f"sqlite:///{project / 'runs.db'}"
    _frozen(db, flows, flows.blunt, "r2")
    cli("approvers", "keygen", "bob.pem")
    cli("approvers", "keygen", "eve.pem")
    assert cli("approvers", "add", "bob", "bob.pem.pub", "--db", db).code == ExitCode.OK
    forged = cli("reject", "r2", "--reason", "no", "--key", "eve.pem", "--db", db)
    assert forged.code == ExitCode.CONFLICT
    assert "unknown signer" in forged.err
    done = cli("reject", "r2", "--reason", "too risky", "--key", "bob.pem", "--db", db)
    assert done.code == ExitCode.OK, done.err
    approve = cli("approve", "r2", "--key", "bob.pem", "--db", db)  # decided already
    assert approve.code == ExitCode.CONFLICT
    failed = cli("resume", "r2", "--app", "rejectflows", "--db", db)
    assert failed.code == ExitCode.RUN_FAILED
    shown = cli("show", "r2", "--json", "--db", db).json()
    assert shown["status"] == "failed"
    assert "ApprovalRejected" in shown["reason"]
    assert "too risky" in shown["reason"]
    assert (project / "ws" / "old.txt").exists()


def test_a_hostile_run_id_is_quoted_in_the_hint(cli: Cli, project: Path) -> None:
    hostile = "q$(touch x)"
    refused = cli("reject", hostile, "--db", f"sqlite:///{project / 'runs.db'}")
    assert refused.code == ExitCode.USAGE
    assert "crashproof reject 'q$(touch x)' --reason" in refused.err


def test_approve_without_a_key_signs_as_the_operator_as_reject_does(
    cli: Cli, project: Path, flows: Any
) -> None:
    # Approve and reject sign alike: with the operator identity unless --key is given
    # (approve used to read ./approver.pem, and failed where reject worked).
    db = f"sqlite:///{project / 'runs.db'}"
    _frozen(db, flows, flows.careful, "r3")
    assert cli("operator", "init", "--name", "alice", "--db", db).code == ExitCode.OK
    done = cli("approve", "r3", "drop", "--db", db)
    assert done.code == ExitCode.OK, done.err
    assert "as alice" in done.err
    with cp.Ledger(db) as ledger:
        events = ledger.journal("r3")
        (approved,) = [e for e in events if e.type is EventType.APPROVAL_GRANTED]
        document = approved.payload["approval"]
        pem = ledger.approvers()["alice"].public_key
        assert verify_statement(pem, document["statement"], document["signature"])
    resumed = cli("resume", "r3", "--app", "rejectflows", "--db", db)
    assert resumed.code == ExitCode.OK, resumed.err
    assert not (project / "ws" / "old.txt").exists()  # executed, once approved
