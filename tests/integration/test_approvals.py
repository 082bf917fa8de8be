"""Signed approvals against a real HTTP target on loopback: a risky act waits, a signed
approval releases it exactly once (even with a crash between the approval's consumption
and the act), an expired one keeps it frozen until a refresh, and anything else that is
not an approval of exactly this act is refused without a request reaching the target."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity.signing import generate_keypair, load_private_key, sign_statement
from crashproof.journal.records import EventType
from crashproof.runtime.guards.approvals import awaiting, expectation, sign_approval
from crashproof.runtime.port import ActSettings
from crashproof.tools.http import HttpTool

from .http_child import make_tool
from .http_server import IdempotentServer

pytestmark = pytest.mark.timeout(60)

RUN = "deploy:1"
KEY = f"{RUN}/create"
# No clock skew allowed: these tests expire approvals within a second, on one host.
FAST = ActSettings(retryable_attempts=3, lookup_attempts=2, backoff=0.01, max_clock_skew=0)
RISKY = cp.Policy("ops-1", allow={"http": "*"}, risk={"http": "high"}, approval_required={"high"})
OPTIONS = cp.RunOptions(policy=RISKY)

LedgerFactory = Callable[..., cp.Ledger]


@pytest.fixture
def ledger_at(tmp_path: Path) -> Iterator[LedgerFactory]:
    opened: list[cp.Ledger] = []

    def factory(**kwargs: Any) -> cp.Ledger:
        kwargs.setdefault("act_settings", FAST)
        ledger = cp.Ledger(f"sqlite:///{tmp_path}/l.db", **kwargs)
        ledger.register_policy(RISKY)
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """alice (to be registered) and mallory (never registered): private key paths."""
    out = {}
    for name in ("alice", "mallory"):
        generate_keypair(tmp_path / f"{name}.pem")
        out[name] = tmp_path / f"{name}.pem"
    return out


def deploy(tool: HttpTool, name: str = "a") -> cp.Workflow[Any]:
    @cp.workflow("deploy", version="1")
    def flow(ctx: cp.Context) -> Any:
        ctx.step("plan", lambda: "plan")
        return ctx.act("create", tool, body={"name": name})["id"]

    return flow


def frozen_for_approval(ledger: cp.Ledger, flow: cp.Workflow[Any], run_id: str = RUN) -> None:
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger.run(flow, run_id=run_id, options=OPTIONS)
    assert frozen.value.status == "awaiting_approval"


def registered(ledger: cp.Ledger, keys: dict[str, Path]) -> None:
    ledger.add_approver("alice", keys["alice"].with_name("alice.pem.pub").read_text(), by="root")


def types(ledger: cp.Ledger, run_id: str = RUN) -> list[str]:
    return [e.type.value for e in ledger._store.load_events(run_id)]


CRASHES = [
    None,
    "after_commit[approval_consumed:create]",  # consumed, intent not yet committed
    "after_commit[act_intent:create]",  # intent committed, the request not yet sent
]


@pytest.mark.parametrize("crash", CRASHES)
def test_approve_executes_the_act_exactly_once(
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
    crash: str | None,
) -> None:
    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    with pytest.raises(cp.RunFrozen):  # resumed code does nothing while it waits
        ledger.resume(RUN)
    assert server.total_requests() == 0
    registered(ledger, keys)
    document = ledger.approve(RUN, "create", key=keys["alice"], ttl=600, by="alice")
    assert (document["statement"]["step"], document["statement"]["operation_id"]) == ("create", KEY)
    assert ledger.get_run(RUN).status is cp.RunStatus.RUNNING  # thawed by the approval

    if crash is not None:
        crashing = ledger_at(crash_points=cp.CrashPoints(match=crash))
        crashing.register(flow)
        with pytest.raises(cp.SimulatedCrash):
            crashing.resume(RUN)
    again = ledger_at()
    again.register(flow)
    result = again.resume(RUN)

    assert result == server.resource(KEY)["id"]  # type: ignore[index]
    assert server.count(KEY, "POST") == 1
    assert len(server.resources()) == 1
    kinds = types(again)
    assert kinds.count("approval_consumed") == 1
    assert kinds.index("approval_consumed") < kinds.index("act_intent")
    consumed = next(
        e for e in again._store.load_events(RUN) if e.type is EventType.APPROVAL_CONSUMED
    )
    assert consumed.payload["nonce"] == document["statement"]["nonce"]
    assert consumed.payload["approver"] == "alice"
    # Replayed later: the receipt, nothing sent, no second consumption.
    assert again.resume(RUN) == result
    assert server.count(KEY, "POST") == 1
    assert types(again).count("approval_consumed") == 1


@pytest.mark.parametrize("crash", [None, "after_commit[approval_consumed:create]"])
def test_an_expired_approval_is_shown_and_keeps_the_act_frozen_until_refreshed(
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
    crash: str | None,
) -> None:
    import time

    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    stale = ledger.approve(RUN, key=keys["alice"], ttl=0.2)
    time.sleep(0.3)
    with pytest.raises(cp.RunFrozen, match="expired") as frozen:
        ledger.resume(RUN)
    assert frozen.value.status == "awaiting_approval"
    assert server.total_requests() == 0
    info = ledger.get_run(RUN)
    assert info.status is cp.RunStatus.AWAITING_APPROVAL
    shown = info.evidence["refused_approvals"]  # type: ignore[index]
    assert shown[0]["approval"]["nonce"] == stale["statement"]["nonce"]
    assert "expired" in shown[0]["reason"]

    fresh = ledger.approve(RUN, "create", key=keys["alice"], ttl=600)
    for field in ("run_id", "step", "operation_id", "intent_digest", "policy"):
        assert fresh["statement"][field] == stale["statement"][field]
    if crash is not None:
        crashing = ledger_at(crash_points=cp.CrashPoints(match=crash))
        crashing.register(flow)
        with pytest.raises(cp.SimulatedCrash):
            crashing.resume(RUN)
        assert server.total_requests() == 0
    again = ledger_at()
    again.register(flow)
    assert again.resume(RUN) == server.resource(KEY)["id"]  # type: ignore[index]
    assert server.count(KEY, "POST") == 1


def _pending(ledger: cp.Ledger, run_id: str = RUN) -> dict[str, Any]:
    freeze = awaiting(ledger._store.load_events(run_id))
    assert freeze is not None
    return expectation(freeze)


def test_approvals_of_anything_else_are_refused_and_nothing_is_journaled(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    frozen_for_approval(ledger, flow, "deploy:2")
    registered(ledger, keys)
    alice = load_private_key(keys["alice"])
    expect = _pending(ledger)
    before = types(ledger)

    def refused(document: dict[str, Any], match: str, run_id: str = RUN) -> None:
        with pytest.raises(cp.ApprovalRefused, match=match):
            ledger.submit_approval(run_id, document)

    refused(sign_approval(alice, "alice", {**expect, "intent_digest": "0" * 64}, ttl=60), "intent")
    refused(sign_approval(alice, "alice", expect, ttl=60), "run id", run_id="deploy:2")
    refused(sign_approval(alice, "alice", {**expect, "generation": 1}, ttl=60), "generation")
    mallory = load_private_key(keys["mallory"])
    refused(sign_approval(mallory, "mallory", expect, ttl=60), "unknown signer 'mallory'")
    refused(sign_approval(mallory, "alice", expect, ttl=60), "signature does not verify")
    tampered = sign_approval(alice, "alice", expect, ttl=60)
    tampered["statement"]["expires_at"] += 86400
    refused(tampered, "signature does not verify")
    with pytest.raises(cp.ApprovalRefused, match="unknown signer"):
        ledger.approve(RUN, key=keys["mallory"])
    with pytest.raises(cp.ApprovalRefused, match="not awaiting approval of step 'plan'"):
        ledger.approve(RUN, "plan", key=keys["alice"])

    assert types(ledger) == before
    assert ledger.get_run(RUN).status is cp.RunStatus.AWAITING_APPROVAL
    assert server.total_requests() == 0


def test_a_reused_nonce_is_refused(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    @cp.workflow("deploy-two", version="1")
    def flow(ctx: cp.Context) -> Any:
        a = ctx.act("create", tool, body={"name": "a"})["id"]
        return [a, ctx.act("create", tool, body={"name": "b"})["id"]]

    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    alice = load_private_key(keys["alice"])
    first = sign_approval(alice, "alice", _pending(ledger), ttl=60, nonce="n-1")
    ledger.submit_approval(RUN, first)
    with pytest.raises(cp.RunFrozen):  # the first act runs, the second waits
        ledger.resume(RUN)
    assert server.count(KEY, "POST") == 1
    second = sign_approval(alice, "alice", _pending(ledger), ttl=60, nonce="n-1")
    assert second["statement"]["step"] == "create#2"
    with pytest.raises(cp.ApprovalRefused, match="nonce n-1 was already consumed"):
        ledger.submit_approval(RUN, second)
    assert server.count(f"{KEY}#2", "POST") == 0
    ledger.approve(RUN, "create#2", key=keys["alice"])
    assert len(ledger.resume(RUN)) == 2
    assert server.count(f"{KEY}#2", "POST") == 1


def test_an_approval_for_another_intent_is_refused_when_the_code_changed(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    ledger = ledger_at()
    frozen_for_approval(ledger, deploy(tool, "a"))
    registered(ledger, keys)
    approved = ledger.approve(RUN, key=keys["alice"])
    changed = ledger_at()
    changed.register(deploy(tool, "b"))  # same step, another body: another intent
    with pytest.raises(cp.RunFrozen, match="intent digest") as frozen:
        changed.resume(RUN)
    assert frozen.value.status == "awaiting_approval"
    refused = frozen.value.evidence["refused_approvals"]  # type: ignore[index]
    assert refused[0]["approval"]["nonce"] == approved["statement"]["nonce"]
    assert server.total_requests() == 0
    assert "approval_consumed" not in types(changed)


def test_the_registry_is_journaled_attributable_and_one_key_per_name(
    ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    ledger = ledger_at()
    registered(ledger, keys)
    registered(ledger, keys)  # the same again: nothing changes
    alice = ledger.approvers()["alice"]
    assert alice.added_by == "root"
    with pytest.raises(cp.CrashproofError, match="already registered"):
        ledger.add_approver("alice", keys["mallory"].with_name("mallory.pem.pub").read_text())
    assert ledger.runs() == []  # the registry is not a user's run
    assert ("crashproof:approvers", None) in ledger.check()
    assert types(ledger, "crashproof:approvers") == ["run_started", "approver_added"]
    with pytest.raises(ValueError, match="crashproof:"):
        ledger.run(deploy(make_tool("http://127.0.0.1:9")), run_id="crashproof:approvers")


def test_an_approval_moved_to_a_ledger_that_does_not_trust_its_signer_is_refused(
    tmp_path: Path,
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
) -> None:
    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    ledger.approve(RUN, key=keys["alice"])
    elsewhere = cp.Ledger(f"sqlite:///{tmp_path / 'other.db'}", act_settings=FAST)
    elsewhere.register_policy(RISKY)
    elsewhere.register(flow)
    elsewhere.import_run(ledger.export_run(RUN), by="ops")
    with pytest.raises(cp.RunFrozen, match="unknown signer 'alice'") as frozen:
        elsewhere.resume(RUN)
    assert frozen.value.status == "awaiting_approval"
    assert server.total_requests() == 0
    elsewhere.close()


def test_the_timeline_credits_the_approver_not_the_worker(
    tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    from crashproof.runtime.operations.audit import run_timeline

    ledger = ledger_at()
    flow = deploy(tool)
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    ledger.approve(RUN, "create", key=load_private_key(keys["alice"]), by="alice@ops")
    ledger.resume(RUN)
    entries = {e["type"]: e for e in run_timeline(ledger, RUN)}
    assert entries["approval_granted"]["operator"]["by"] == "alice@ops"
    assert entries["run_thawed"]["operator"]["by"] == "alice@ops"
    assert "operator" not in entries["act_intent"]  # the worker that resumed it
    assert entries["act_intent"]["worker"] == ledger.worker_id


def test_an_approval_binds_the_environment_the_approver_saw(
    tmp_path: Path, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "config.txt").write_text("v1\n")
    policy = cp.Policy(
        "ws-1", allow={"workspace": "*"}, risk={"workspace": "high"}, approval_required={"high"}
    )

    @cp.workflow("rewrite", version="1")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("w", cp.Workspace(root), op="write", path="out.txt", content="new\n")

    ledger = ledger_at()
    ledger.register_policy(policy)
    with pytest.raises(cp.RunFrozen):
        ledger.run(flow, run_id="ws", options=cp.RunOptions(policy=policy))
    pending = ledger.get_run("ws")
    registered(ledger, keys)
    ledger.approve("ws", "w", key=keys["alice"], by="alice")
    (root / "config.txt").write_text("v2\n")  # the workspace changes after approval
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger.resume("ws")
    assert frozen.value.status == "awaiting_approval"
    assert "environment" in str(frozen.value)
    assert not (root / "out.txt").exists()
    assert pending.status is cp.RunStatus.AWAITING_APPROVAL
    ledger.approve("ws", "w", key=keys["alice"], by="alice")  # approve what is there now
    ledger.resume("ws")
    assert (root / "out.txt").read_text() == "new\n"


def test_an_approval_for_a_run_that_moved_out_is_refused_and_nothing_is_written(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    """The run left this ledger (exported as a move) while it waited: approving it here
    is refused, journals nothing and sends nothing; the move's continuation is elsewhere."""
    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    ledger.export_run(RUN, by="operator")
    before = types(ledger)
    assert before[-1] == "run_moved"
    with pytest.raises(cp.RunMoved, match="was exported at generation"):
        ledger.approve(RUN, "create", key=keys["alice"], ttl=600, by="alice")
    assert types(ledger) == before
    assert ledger.get_run(RUN).status is cp.RunStatus.MOVED
    assert server.total_requests() == 0


def test_an_approval_that_expired_after_its_effect_committed_reconciles_without_a_new_one(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    # Unproven before (#28): the approval is consumed before the intent, the effect
    # commits, the reply is lost and the process dies; the resume comes after the
    # approval's expiry. The act is reconciled by lookup: no new approval is needed,
    # nothing is sent again.
    import time

    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    ledger.approve(RUN, "create", key=keys["alice"], ttl=0.5)
    server.arm(drop_after_commit=1, key=KEY)  # committed at the target, reply lost
    crashing = ledger_at(crash_points=cp.CrashPoints(match="before_commit[act_unknown:create]"))
    crashing.register(flow)
    with pytest.raises(cp.SimulatedCrash):
        crashing.resume(RUN)
    assert server.count(KEY, "POST") == 1
    time.sleep(0.6)  # the approval has expired now

    again = ledger_at()
    again.register(flow)
    assert again.resume(RUN) == server.resource(KEY)["id"]  # type: ignore[index]
    assert server.count(KEY, "POST") == 1
    assert types(again).count("approval_consumed") == 1
    assert "approval_granted" in types(again)


# -- approval-bound receipts (001: an adapter others can reach binds the approval) ------


class SharedHttpTool(HttpTool):
    """A target other callers can reach: its receipts must bind the approval."""

    shared = True


def _approved_run(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> tuple[cp.Ledger, cp.Workflow[Any], dict[str, Any]]:
    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    document = ledger.approve(RUN, "create", key=keys["alice"], ttl=600)
    return ledger, flow, document


def test_the_target_receives_and_binds_the_approval_it_acts_under(
    server: IdempotentServer, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    with SharedHttpTool(
        server.url, "/resources", lookup_path="/resources/by-key/{operation_id}"
    ) as shared:
        ledger, _, document = _approved_run(server, shared, ledger_at, keys)
        assert ledger.resume(RUN) == server.resource(KEY)["id"]  # type: ignore[index]
    consumed = next(e for e in ledger.journal(RUN) if e.type is EventType.APPROVAL_CONSUMED)
    headers = server.requests(KEY)[-1]["headers"]
    assert headers["Crashproof-Approval-Digest"] == consumed.payload["statement_digest"]
    assert float(headers["Crashproof-Approval-Expires"]) == document["statement"]["expires_at"]
    assert consumed.payload["expires_at"] == document["statement"]["expires_at"]


def test_an_effect_the_target_committed_after_the_approval_expired_goes_to_review(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    # Before: a receipt carried no commit time, so an effect a queueing target committed
    # after the approval expired was reconciled as approved.
    ledger, _, _ = _approved_run(server, tool, ledger_at, keys)
    server.clock_offset = 3600.0  # the target commits (by its clock) an hour later
    with pytest.raises(cp.RunFrozen, match="after the approval expired") as frozen:
        ledger.resume(RUN)
    assert frozen.value.status == "needs_review"
    evidence = frozen.value.evidence or {}
    assert evidence["receipt"]["committed_at"] > evidence["approval"]["expires_at"]
    assert server.count(KEY, "POST") == 1


def test_a_shared_targets_receipt_without_the_approval_binding_goes_to_review(
    tmp_path: Path, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    plain = IdempotentServer(tmp_path / "plain.json", keeps_fingerprints=False).start()
    try:
        with SharedHttpTool(
            plain.url, "/resources", lookup_path="/resources/by-key/{operation_id}"
        ) as shared:
            ledger, _, _ = _approved_run(plain, shared, ledger_at, keys)
            with pytest.raises(cp.RunFrozen, match="does not bind the approval"):
                ledger.resume(RUN)
        assert plain.count(KEY, "POST") == 1
    finally:
        plain.stop()


# -- bad input: refused with one clear error, nothing journaled ------------------------


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), 86401, True, "5"])
def test_a_negative_or_absurd_clock_setting_is_refused(bad: Any) -> None:
    for field in ("max_clock_skew", "window_margin"):
        with pytest.raises(ValueError, match=f"{field} must be a number of seconds from 0"):
            ActSettings(**{field: bad})


@pytest.mark.parametrize("ttl", [0, -5, 31 * 86400])
def test_an_approval_expiring_in_the_past_or_far_in_the_future_changes_nothing(
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
    ttl: float,
) -> None:
    ledger = ledger_at()
    frozen_for_approval(ledger, deploy(tool))
    registered(ledger, keys)
    before = types(ledger)
    with pytest.raises(ValueError, match="time to live from 1 s to 30 days"):
        ledger.approve(RUN, "create", key=keys["alice"], ttl=ttl)
    # Signed elsewhere, beyond what sign_approval makes: refused when submitted.
    freeze = awaiting(ledger._store.load_events(RUN))
    assert freeze is not None
    private = load_private_key(keys["alice"])
    issued = 1.0e9 if ttl <= 0 else None  # long expired, or valid for 31 days
    document = sign_approval(private, "alice", expectation(freeze), ttl=600, now=issued)
    if ttl > 0:
        statement = {
            **document["statement"],
            "expires_at": document["statement"]["issued_at"] + ttl,
        }
        document = {"statement": statement, "signature": sign_statement(private, statement)}
    with pytest.raises(cp.ApprovalRefused, match=r"expired|more than 30 days"):
        ledger.submit_approval(RUN, document)
    assert types(ledger) == before
    assert server.total_requests() == 0


@pytest.mark.parametrize("late", [False, True])
def test_a_private_tool_without_commit_time_is_judged_by_its_receipt_time(
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
    late: bool,
) -> None:
    # The target binds nothing of time; the tool is private to the runtime (shared =
    # False), so the ledger's clock when the receipt is taken stands for the commit.
    import time

    server.reports_commit_time = False
    flow = deploy(tool)
    ledger = ledger_at()
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    ledger.approve(RUN, "create", key=keys["alice"], ttl=1.0)
    crashing = ledger_at(crash_points=cp.CrashPoints(match="inside[act:create:responded]"))
    crashing.register(flow)
    with pytest.raises(cp.SimulatedCrash):
        crashing.resume(RUN)
    assert server.count(KEY, "POST") == 1
    if late:
        time.sleep(1.1)  # expired before the receipt is taken by the lookup
    again = ledger_at()
    again.register(flow)
    if late:
        with pytest.raises(cp.RunFrozen, match="the ledger's clock, at its receipt"):
            again.resume(RUN)
        assert again.get_run(RUN).status is cp.RunStatus.NEEDS_REVIEW
    else:
        assert again.resume(RUN) == server.resource(KEY)["id"]  # type: ignore[index]
    assert server.count(KEY, "POST") == 1


def test_an_approved_act_refused_by_another_runs_hold_waits_and_sends_once_approved(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    """The approval is consumed, then the store refuses the act's intent (another run's
    act on the same intent is in flight): the run stops to wait, nothing sent, and its
    resume once the holder is resolved sends under that one approval, consumed once."""
    flow = deploy(tool)
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    crashing = ledger_at(crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow, run_id="holder")  # no policy: sent, its receipt lost
    ledger = ledger_at()
    ledger.register(flow)
    frozen_for_approval(ledger, flow)
    registered(ledger, keys)
    ledger.approve(RUN, "create", key=keys["alice"], ttl=600, by="alice")
    with pytest.raises(cp.RunStopped, match="waiting for another run: run 'holder' holds"):
        ledger.resume(RUN)
    assert server.count(KEY, "POST") == 0
    assert ledger.resume("holder") == server.resource("holder/create")["id"]  # type: ignore[index]
    result = ledger.resume(RUN)
    assert result == server.resource(KEY)["id"]  # type: ignore[index]
    assert server.count(KEY, "POST") == 1
    assert server.count("holder/create", "POST") == 1
    assert types(ledger).count("approval_consumed") == 1
