"""The README's how-to, as the CLI runs it: a risky act waits for a human, an approval
that expired keeps it waiting, a fresh one releases it once; a review case is listed,
shown and decided with a signed decision."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import ExitCode

Cli = Callable[..., Any]

RISKY = """
import crashproof as cp

POLICY = cp.Policy(
    "ops-1",
    allow={"workspace": "*"},
    risk={"workspace": lambda tool, params: "high" if params["op"] == "delete" else "low"},
    approval_required={"high"},
)
WS = cp.Workspace("ws")


@cp.workflow("cleanup", version="1")
def cleanup(ctx):
    ctx.act("note", WS, op="append", path="log.txt", text="cleaning\\n")
    ctx.act("drop", WS, op="delete", path="old.txt")
    return "cleaned"
"""


@pytest.fixture
def risky(project: Path) -> Any:
    (project / "riskyflows.py").write_text(RISKY, encoding="utf-8")
    (project / "ws").mkdir()
    (project / "ws" / "old.txt").write_text("keep me until approved\n")
    sys.path.insert(0, str(project))
    module = importlib.import_module("riskyflows")
    yield module
    sys.modules.pop("riskyflows", None)


def test_a_risky_act_waits_for_a_human(cli: Cli, project: Path, risky: Any) -> None:
    db = f"sqlite:///{project / 'runs.db'}"
    with cp.Ledger(db) as ledger, pytest.raises(cp.RunFrozen):
        ledger.run(risky.cleanup, run_id="c1", options=cp.RunOptions(policy=risky.POLICY))
    old = project / "ws" / "old.txt"

    assert cli("approvers", "keygen", "alice.pem").code == ExitCode.OK
    assert cli("approvers", "keygen", "mallory.pem").code == ExitCode.OK
    assert cli("approvers", "add", "alice", "alice.pem.pub", "--by", "root", "--db", db).code == 0
    listed = cli("approvers", "list", "--json", "--db", db)
    assert [a["name"] for a in listed.json()] == ["alice"]

    waiting = cli("resume", "c1", "--app", "riskyflows", "--db", db)
    assert waiting.code == ExitCode.RUN_FROZEN
    assert "crashproof approve c1" in waiting.err

    refused = cli("approve", "c1", "drop", "--key", "mallory.pem", "--db", db)
    assert refused.code == ExitCode.CONFLICT
    assert "unknown signer" in refused.err

    assert cli("approve", "c1", "drop", "--key", "alice.pem", "--ttl", "1s", "--db", db).code == 0
    time.sleep(1.1)
    expired = cli("resume", "c1", "--app", "riskyflows", "--db", db)
    assert expired.code == ExitCode.RUN_FROZEN
    shown = cli("show", "c1", "--json", "--db", db).json()
    assert shown["status"] == "awaiting_approval"
    assert "expired" in shown["evidence"]["refused_approvals"][0]["reason"]
    (stale,) = shown["humans"]
    assert (stale["signer"], stale["step"], stale["consumed"]) == ("alice", "drop", False)
    assert "approvals and decisions" in cli("show", "c1", "--db", db).out
    assert old.exists()

    approved = cli("approve", "c1", "drop", "--key", "alice.pem", "--ttl", "15m", "--db", db)
    assert approved.code == ExitCode.OK
    assert "c1/drop" in approved.err
    done = cli("resume", "c1", "--app", "riskyflows", "--db", db)
    assert done.code == ExitCode.OK, done.err
    assert not old.exists()
    final = cli("show", "c1", "--json", "--db", db).json()
    assert final["status"] == "succeeded"
    assert [h["consumed"] for h in final["humans"]] == [False, True]
    bad_ttl = cli("approve", "c1", "--key", "alice.pem", "--ttl", "soon", "--db", db)
    assert bad_ttl.code == ExitCode.USAGE
    for far in ("31d", "0s"):  # an expiry far in the future, or already past
        bad_ttl = cli("approve", "c1", "--key", "alice.pem", "--ttl", far, "--db", db)
        assert bad_ttl.code == ExitCode.USAGE
        assert "is not a duration from 1s to 30d" in bad_ttl.err
        assert "Traceback" not in bad_ttl.err


def test_review_list_show_and_a_signed_abort(cli: Cli, project: Path) -> None:
    db = f"sqlite:///{project / 'runs.db'}"
    assert cli("run", "flows:flaky", "--run-id", "f1", "--db", db).code == 6  # not JSON yet
    (project / "swerve.txt").write_text("")
    frozen = cli("resume", "f1", "--app", "flows", "--db", db)
    assert frozen.code == ExitCode.RUN_FROZEN
    assert "crashproof review list f1" in frozen.err

    cli("approvers", "keygen", "bob.pem")
    cli("approvers", "add", "bob", "bob.pem.pub", "--db", db)
    (case,) = cli("review", "list", "--json", "--db", db).json()
    assert case["state"] == "open"
    assert case["decisions"] == ["abort"]
    table = cli("review", "list", "f1", "--db", db)
    assert case["case_id"] in table.out
    shown = cli("review", "show", case["case_id"], "--db", db).json()
    assert shown["fingerprint"] == case["fingerprint"]
    assert "non-determinism" in shown["evidence"]["reason"]

    replan = cli("review", "decide", case["case_id"], "replan", "--key", "bob.pem", "--db", db)
    assert replan.code == ExitCode.CONFLICT
    assert "replan needs a case raised by an act in flight" in replan.err
    abort = cli("review", "decide", case["case_id"], "abort", "--key", "bob.pem", "--db", db)
    assert abort.code == ExitCode.OK, abort.err
    assert "now failed" in abort.err
    assert cli("show", "f1", "--json", "--db", db).json()["status"] == "failed"
    assert (
        cli("review", "list", "--state", "resolved", "--json", "--db", db).json()[0]["case_id"]
        == case["case_id"]
    )


def test_run_binds_a_policy_from_the_cli(cli: Cli, project: Path, risky: Any) -> None:
    db = f"sqlite:///{project / 'runs.db'}"
    started = cli(
        "run", "riskyflows:cleanup", "--run-id", "c2", "--policy", "riskyflows:POLICY", "--db", db
    )
    assert started.code == ExitCode.RUN_FROZEN, started.err
    shown = cli("show", "c2", "--json", "--db", db).json()
    assert shown["status"] == "awaiting_approval"
    assert shown["evidence"]["pending_act"]["policy"]["version"] == "ops-1"
    assert (project / "ws" / "old.txt").exists()
    assert cli("approvers", "keygen", "alice.pem").code == ExitCode.OK
    assert cli("approvers", "add", "alice", "alice.pem.pub", "--by", "root", "--db", db).code == 0
    assert cli("approve", "c2", "drop", "--key", "alice.pem", "--db", db).code == ExitCode.OK
    assert cli("resume", "c2", "--app", "riskyflows", "--db", db).code == ExitCode.OK
    assert not (project / "ws" / "old.txt").exists()

    wrong = cli(
        "run", "riskyflows:cleanup", "--run-id", "c3", "--policy", "riskyflows:WS", "--db", db
    )
    assert wrong.code == ExitCode.USAGE
    assert "not a cp.Policy" in wrong.err
    missing = cli(
        "run", "riskyflows:cleanup", "--run-id", "c3", "--policy", "riskyflows", "--db", db
    )
    assert missing.code == ExitCode.USAGE
    assert cli("show", "c3", "--db", db).code == ExitCode.USAGE  # nothing was started
