"""Review cases and signed replan/abort decisions against a real HTTP target on loopback.

The case: the target already holds this act's operation id with another intent (a
receipt conflict). A reviewer's signed ``replan`` quarantines that operation id for good
and runs the act under ``@2``; ``abort`` fails the run with all evidence kept; a receipt
that changed after the reviewer signed keeps the case open. Each decision is also
resumed after a crash between its consumption and what it lets happen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity.signing import generate_keypair, load_private_key
from crashproof.journal.records import EventType
from crashproof.runtime.guards.review import sign_decision
from crashproof.runtime.port import ActSettings
from crashproof.tools.http import HttpTool

from .http_server import IdempotentServer

pytestmark = pytest.mark.timeout(60)

RUN = "release:7"
OLD = f"{RUN}/create"
NEW = f"{RUN}/create@2"
FAST = ActSettings(retryable_attempts=3, lookup_attempts=2, backoff=0.01)
CONSUMED = "after_commit[review_consumed:create]"

LedgerFactory = Callable[..., cp.Ledger]


@pytest.fixture
def ledger_at(tmp_path: Path) -> Iterator[LedgerFactory]:
    opened: list[cp.Ledger] = []

    def factory(**kwargs: Any) -> cp.Ledger:
        kwargs.setdefault("act_settings", FAST)
        ledger = cp.Ledger(f"sqlite:///{tmp_path}/l.db", **kwargs)
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("bob", "mallory"):
        generate_keypair(tmp_path / f"{name}.pem")
        out[name] = tmp_path / f"{name}.pem"
    return out


def release(tool: HttpTool, name: str = "v7") -> cp.Workflow[Any]:
    @cp.workflow("release", version="1")
    def flow(ctx: cp.Context) -> Any:
        ctx.step("plan", lambda: "plan")
        return ctx.act("create", tool, body={"name": name})["id"]

    return flow


def conflicted(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> tuple[cp.Ledger, cp.Workflow[Any], cp.ReviewCase]:
    """A run frozen on a receipt conflict, bob registered; returns its open case."""
    server.seed(OLD, "0" * 64, {"name": "someone else"})
    flow = release(tool)
    ledger = ledger_at()
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger.run(flow, run_id=RUN)
    assert frozen.value.status == "needs_review"
    ledger.add_approver("bob", keys["bob"].with_name("bob.pem.pub").read_text(), by="root")
    (case,) = ledger.review_cases(RUN)
    return ledger, flow, case


def resumed(ledger_at: LedgerFactory, flow: cp.Workflow[Any], crash: str | None) -> cp.Ledger:
    """Resume once crashing at ``crash`` (if any); return a fresh ledger to go on with."""
    if crash is not None:
        crashing = ledger_at(crash_points=cp.CrashPoints(match=crash))
        crashing.register(flow)
        with pytest.raises(cp.SimulatedCrash):
            crashing.resume(RUN)
    again = ledger_at()
    again.register(flow)
    return again


def types(ledger: cp.Ledger) -> list[str]:
    return [e.type.value for e in ledger._store.load_events(RUN)]


def test_a_case_holds_all_the_evidence(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    ledger, _, case = conflicted(server, tool, ledger_at, keys)
    assert (case.case_id, case.state, case.key) == (f"{RUN}#{case.seq}", "open", "create")
    evidence = case.evidence
    pending = evidence["pending_intent"]
    assert (pending["operation_id"], pending["params"]) == (OLD, {"body": {"name": "v7"}})
    assert evidence["digests"]["journal"] == pending["intent_digest"]
    assert evidence["digests"]["receipt"] == "0" * 64
    assert evidence["receipt"]["receipt_id"] == server.resource(OLD)["id"]  # type: ignore[index]
    assert len(evidence["receipt_fingerprint"]) == 64
    assert evidence["generation"] == case.seq + 1
    assert [t["type"] for t in evidence["trace"]] == ["act_intent"]
    assert ledger.review_case(case.case_id).fingerprint == case.fingerprint
    assert [c.case_id for c in ledger.review_cases(state="open")] == [case.case_id]


@pytest.mark.parametrize("crash", [None, CONSUMED, "after_commit[act_intent:create]"])
def test_replan_quarantines_the_old_operation_id_and_completes(
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
    crash: str | None,
) -> None:
    ledger, flow, case = conflicted(server, tool, ledger_at, keys)
    posts_before = server.count(OLD, "POST")
    ledger.decide(case.case_id, "replan", key=keys["bob"], by="bob")
    assert ledger.review_case(case.case_id).state == "decided"

    again = resumed(ledger_at, flow, crash)
    result = again.resume(RUN)

    assert result == server.resource(NEW)["id"]  # type: ignore[index]
    assert server.count(NEW, "POST") == 1
    assert server.count(OLD, "POST") == posts_before  # the quarantined id: never sent again
    assert server.resource(OLD)["body"] == {"name": "someone else"}  # type: ignore[index]
    step = next(s for s in again.get_run(RUN).steps if s.key == "create")
    assert (step.status, step.operation_id) == (cp.StepStatus.SUCCEEDED, NEW)
    consumed = [e for e in again._store.load_events(RUN) if e.type is EventType.REVIEW_CONSUMED]
    assert len(consumed) == 1
    assert consumed[0].payload["quarantined"] == [OLD]
    assert again.review_case(case.case_id).state == "resolved"
    requests = server.total_requests()
    assert again.resume(RUN) == result  # replayed: nothing sent
    assert server.total_requests() == requests


@pytest.mark.parametrize("crash", [None, CONSUMED])
def test_abort_fails_the_run_and_keeps_the_evidence(
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
    crash: str | None,
) -> None:
    ledger, flow, case = conflicted(server, tool, ledger_at, keys)
    posts = server.count(OLD, "POST")
    ledger.decide(case.case_id, "abort", key=keys["bob"])
    again = resumed(ledger_at, flow, crash)
    with pytest.raises(cp.RunFailed, match="aborted by bob"):
        again.resume(RUN)
    info = again.get_run(RUN)
    assert info.status is cp.RunStatus.FAILED
    assert info.error is not None
    assert info.error["type"] == "ReviewAborted"
    kept = again.review_case(case.case_id)
    assert (kept.state, kept.fingerprint) == ("resolved", case.fingerprint)
    assert kept.evidence["receipt"] == case.evidence["receipt"]
    assert server.count(OLD, "POST") == posts
    assert server.count(NEW, "POST") == 0
    with pytest.raises(cp.RunFailed):
        again.resume(RUN)
    assert types(again).count("run_failed") == 1


def test_a_receipt_that_changed_after_signing_keeps_the_case_open(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    ledger, flow, case = conflicted(server, tool, ledger_at, keys)
    ledger.decide(case.case_id, "replan", key=keys["bob"])
    server.seed(OLD, "1" * 64, {"name": "changed meanwhile"})  # the target moved on

    again = resumed(ledger_at, flow, None)
    with pytest.raises(cp.RunFrozen, match="changed since the decision was signed") as frozen:
        again.resume(RUN)
    assert frozen.value.status == "needs_review"
    assert server.count(NEW, "POST") == 0
    assert "review_consumed" not in types(again)
    cases = again.review_cases(RUN)
    assert [c.state for c in cases] == ["superseded", "open"]
    assert cases[1].evidence["frozen"]["supersedes"] == case.case_id
    # A fresh decision on the case as it is now goes through, exactly once.
    again.decide(cases[1].case_id, "replan", key=keys["bob"])
    final = resumed(ledger_at, flow, CONSUMED)
    assert final.resume(RUN) == server.resource(NEW)["id"]  # type: ignore[index]
    assert server.count(NEW, "POST") == 1


def test_a_result_that_changed_after_signing_keeps_the_case_open(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    # Same receipt id, same stored intent digest, another result: before, only the id and
    # the digest were compared and the replan ran over a result the reviewer never saw.
    ledger, flow, case = conflicted(server, tool, ledger_at, keys)
    ledger.decide(case.case_id, "replan", key=keys["bob"])
    edited = server.edit(OLD, {"name": "edited after the review"})
    assert edited["id"] == case.evidence["receipt"]["receipt_id"]

    again = resumed(ledger_at, flow, None)
    with pytest.raises(cp.RunFrozen, match="changed since the decision was signed") as frozen:
        again.resume(RUN)
    assert "result" in str(frozen.value)
    assert server.count(NEW, "POST") == 0
    assert "review_consumed" not in types(again)
    cases = again.review_cases(RUN)
    assert [c.state for c in cases] == ["superseded", "open"]
    assert cases[1].evidence["receipt"]["result"]["body"] == {"name": "edited after the review"}


def test_decisions_that_do_not_fit_the_case_are_refused(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    ledger, _, case = conflicted(server, tool, ledger_at, keys)
    bob, mallory = load_private_key(keys["bob"]), load_private_key(keys["mallory"])
    before = types(ledger)

    def refused(document: dict[str, Any], match: str) -> None:
        with pytest.raises(cp.DecisionRefused, match=match):
            ledger.submit_decision(case.case_id, document)

    refused(sign_decision(mallory, "mallory", case, "replan"), "unknown signer")
    refused(sign_decision(mallory, "bob", case, "replan"), "signature does not verify")
    tampered = sign_decision(bob, "bob", case, "abort")
    tampered["statement"]["decision"] = "replan"
    refused(tampered, "signature does not verify")
    stale = sign_decision(bob, "bob", case, "replan")
    stale["statement"]["case_fingerprint"] = "f" * 64
    stale["signature"] = sign_decision(bob, "bob", case, "replan")["signature"]
    refused(stale, "signature does not verify")
    refused(sign_decision(bob, "bob", case, "retry"), "unknown decision")
    # The target holds this operation id under another intent: not this act's to keep.
    assert case.decisions == ["replan", "abort"]
    refused(sign_decision(bob, "bob", case, "keep"), "not provably this act's")
    with pytest.raises(cp.DecisionRefused, match="unknown signer"):
        ledger.decide(case.case_id, "replan", key=keys["mallory"])
    assert types(ledger) == before

    used = sign_decision(bob, "bob", case, "replan", nonce="once")
    ledger.submit_decision(case.case_id, used)
    with pytest.raises(cp.DecisionRefused, match="nonce once was already used"):
        ledger.submit_decision(case.case_id, sign_decision(bob, "bob", case, "abort", nonce="once"))


def test_a_changed_step_can_be_aborted_not_replanned(
    ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    def flow_with(arg: str) -> cp.Workflow[Any]:
        @cp.workflow("steps", version="1")
        def flow(ctx: cp.Context) -> Any:
            first = ctx.step("compute", str.upper, arg)
            return [first, ctx.step("finish", str.lower, arg)]

        return flow

    crashing = ledger_at(crash_points=cp.CrashPoints(match="after_commit[step_done:compute]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow_with("a"), run_id=RUN)
    changed = ledger_at()
    changed.register(flow_with("b"))  # the code changed under the run: non-determinism
    with pytest.raises(cp.RunFrozen) as frozen:
        changed.resume(RUN)
    assert frozen.value.status == "needs_review"
    changed.add_approver("bob", keys["bob"].with_name("bob.pem.pub").read_text())
    (case,) = changed.review_cases(RUN)
    assert case.to_json()["decisions"] == ["abort"]
    with pytest.raises(cp.DecisionRefused, match="replan needs a case raised by an act in flight"):
        changed.decide(case.case_id, "replan", key=keys["bob"])
    changed.decide(case.case_id, "abort", key=keys["bob"])  # consumed at once
    assert changed.get_run(RUN).status is cp.RunStatus.FAILED
    with pytest.raises(cp.RunFailed, match="ReviewAborted"):
        changed.resume(RUN)
    assert changed.review_case(case.case_id).state == "resolved"


def test_an_act_in_flight_the_code_no_longer_reaches_can_be_aborted_at_once(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    crashing = ledger_at(crash_points=cp.CrashPoints(match="after_commit[act_intent:create]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(release(tool), run_id=RUN)

    @cp.workflow("release", version="1")
    def swerved(ctx: cp.Context) -> Any:
        ctx.step("plan", lambda: "plan")
        return ctx.act("other", tool, body={"name": "v7"})["id"]

    changed = ledger_at()
    changed.register(swerved)
    with pytest.raises(cp.RunFrozen, match="in flight"):
        changed.resume(RUN)
    changed.add_approver("bob", keys["bob"].with_name("bob.pem.pub").read_text())
    (case,) = changed.review_cases(RUN)
    assert case.evidence["pending_intent"]["operation_id"] == OLD
    with pytest.raises(cp.DecisionRefused, match="replan needs"):
        changed.decide(case.case_id, "replan", key=keys["bob"])
    changed.decide(case.case_id, "abort", key=keys["bob"])
    with pytest.raises(cp.RunFailed, match="ReviewAborted"):
        changed.resume(RUN)
    assert server.total_requests() == 0


def test_a_decision_moved_to_a_ledger_that_does_not_trust_its_signer_is_not_applied(
    tmp_path: Path,
    server: IdempotentServer,
    tool: HttpTool,
    ledger_at: LedgerFactory,
    keys: dict[str, Path],
) -> None:
    ledger, flow, case = conflicted(server, tool, ledger_at, keys)
    ledger.decide(case.case_id, "replan", key=keys["bob"])
    elsewhere = cp.Ledger(f"sqlite:///{tmp_path / 'other.db'}", act_settings=FAST)
    elsewhere.register(flow)
    elsewhere.import_run(ledger.export_run(RUN), by="ops")
    with pytest.raises(cp.RunFrozen, match=r"no longer verifies.*unknown signer 'bob'"):
        elsewhere.resume(RUN)
    assert server.count(NEW, "POST") == 0
    assert [c.state for c in elsewhere.review_cases(RUN)] == ["superseded", "open"]
    elsewhere.close()


class Mailer(cp.Tool):
    """A target with neither lookup nor dedupe: an act whose reply was lost freezes."""

    name = "mailer"
    version = "1"
    supports_lookup = False

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.lose_reply = True

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.sent.append(call.operation_id)
        if self.lose_reply:
            self.lose_reply = False
            raise TimeoutError("the reply was lost")  # an unknown outcome
        return cp.Receipt(call.operation_id, {"sent": call.operation_id})


def test_a_replan_of_an_act_that_cannot_be_re_read_needs_it_stated(
    ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    # Before, a tool without lookup got no re-read at all and any replan ran. Now the
    # decision must state that no re-read is possible, or the case stays frozen.
    mailer = Mailer()

    @cp.workflow("mail", version="1")
    def mail(ctx: cp.Context) -> Any:
        return ctx.act("send", mailer, to="ops")

    ledger = ledger_at()
    with pytest.raises(cp.RunFrozen):
        ledger.run(mail, run_id="mail:1")
    ledger.add_approver("bob", keys["bob"].with_name("bob.pem.pub").read_text(), by="root")
    (case,) = ledger.review_cases("mail:1")
    ledger.decide(case.case_id, "replan", key=keys["bob"])
    with pytest.raises(cp.RunFrozen, match="does not state that no re-read is possible"):
        ledger.resume("mail:1")
    assert mailer.sent == ["mail:1/send"]  # nothing executed
    cases = ledger.review_cases("mail:1")
    assert [c.state for c in cases] == ["superseded", "open"]

    ledger.decide(cases[1].case_id, "replan", key=keys["bob"], no_reread=True)
    assert ledger.resume("mail:1") == {"sent": "mail:1/send@2"}
    assert mailer.sent == ["mail:1/send", "mail:1/send@2"]
    decided = [e for e in ledger._store.load_events("mail:1") if e.type is EventType.REVIEW_DECIDED]
    assert [d.payload["decision"]["statement"].get("no_reread") for d in decided] == [None, True]


def test_a_decision_is_not_consumed_by_other_code_than_it_was_signed_for(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    # Before, a decision bound the case only: a replan signed while version 1 ran was
    # consumed by version 2 code (compatible_with) the reviewer never saw.
    ledger, _, case = conflicted(server, tool, ledger_at, keys)
    assert case.versions == {"workflow": "1", "policy": None}
    document = ledger.decide(case.case_id, "replan", key=keys["bob"])
    assert document["statement"]["versions"] == {"workflow": "1", "policy": None}

    @cp.workflow("release", version="2", compatible_with=["1"])
    def newer(ctx: cp.Context) -> Any:
        ctx.step("plan", lambda: "plan")
        return ctx.act("create", tool, body={"name": "v7"})["id"]

    again = ledger_at()
    again.register(newer)
    with pytest.raises(cp.RunFrozen, match="this drive runs") as frozen:
        again.resume(RUN)
    assert frozen.value.status == "needs_review"
    assert server.count(NEW, "POST") == 0
    cases = again.review_cases(RUN)
    assert [c.state for c in cases] == ["superseded", "open"]
    assert cases[1].versions == {"workflow": "2", "policy": None}
    # Signed again under the versions now running, it goes through once.
    again.decide(cases[1].case_id, "replan", key=keys["bob"])
    assert again.resume(RUN) == server.resource(NEW)["id"]  # type: ignore[index]
    assert server.count(NEW, "POST") == 1


def test_a_decision_signed_for_other_versions_than_the_case_is_refused(
    server: IdempotentServer, tool: HttpTool, ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    ledger, _, case = conflicted(server, tool, ledger_at, keys)
    bob = load_private_key(keys["bob"])
    document = sign_decision(bob, "bob", case, "replan")
    other = cp.ReviewCase(**{**{f: getattr(case, f) for f in case.__slots__}, "versions": {}})
    forged = sign_decision(bob, "bob", other, "replan")
    assert document["statement"]["versions"] != forged["statement"]["versions"]
    with pytest.raises(cp.DecisionRefused, match="signed for workflow/policy versions"):
        ledger.submit_decision(case.case_id, forged)


class Forge(cp.Tool):
    """An in-memory target that observes its environment (a repository head) and holds
    the act's operation id under another caller's intent: a receipt conflict."""

    name = "forge"
    version = "1"

    def __init__(self) -> None:
        self.head = "h1"
        self.created: list[str] = []

    def observe(self) -> cp.Observation:
        return cp.Observation("forge:repo", self.head)

    def execute(self, call: cp.Call) -> cp.Receipt:
        if call.operation_id.endswith("@2"):
            self.created.append(call.operation_id)
            return cp.Receipt(call.operation_id, {"ok": True}, call.intent_digest)
        return cp.Receipt("theirs", {"ok": False}, "0" * 64)  # the key is another's

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if call.operation_id in self.created:
            return cp.Receipt(call.operation_id, {"ok": True}, call.intent_digest)
        if call.operation_id.endswith("@2"):
            return None
        return cp.Receipt("theirs", {"ok": False}, "0" * 64)


def test_an_environment_change_after_signing_re_freezes(
    ledger_at: LedgerFactory, keys: dict[str, Path]
) -> None:
    # Before: an act in flight without an expected result passes the resume's
    # environment check (its own effect could explain any change), and the replan ran on
    # a repository the reviewer never saw.
    forge = Forge()

    @cp.workflow("ship", version="1")
    def ship(ctx: cp.Context) -> Any:
        return ctx.act("open", forge, title="t")

    ledger = ledger_at()
    with pytest.raises(cp.RunFrozen):
        ledger.run(ship, run_id="ship:1")
    ledger.add_approver("bob", keys["bob"].with_name("bob.pem.pub").read_text(), by="root")
    (case,) = ledger.review_cases("ship:1")
    assert case.evidence["frozen"]["environment_fingerprint"]
    ledger.decide(case.case_id, "replan", key=keys["bob"])
    forge.head = "h2"  # the repository moved on after the reviewer signed
    with pytest.raises(cp.RunFrozen, match="changed since the case froze"):
        ledger.resume("ship:1")
    assert forge.created == []
    assert "review_consumed" not in [e.type.value for e in ledger.journal("ship:1")]
    cases = ledger.review_cases("ship:1")
    assert [c.state for c in cases] == ["superseded", "open"]
    # Decided again on the world as it is now, the replan runs once.
    ledger.decide(cases[1].case_id, "replan", key=keys["bob"])
    assert ledger.resume("ship:1") == {"ok": True}
    assert forge.created == ["ship:1/open@2"]
