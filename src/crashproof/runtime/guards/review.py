"""Review cases and signed replan/abort decisions.

Every ``needs_review`` freeze (receipt conflict, non-determinism, drift, an unknown
outcome the tool cannot look up, ...) is a **review case**: the ``run_frozen`` record
plus everything the journal holds about its step — the pending intent, both digests,
the full receipt and its fingerprint, the generation, the trace of the step's records.
Its id is ``RUN_ID#SEQ`` (the freeze's journal position); its **fingerprint** is the
SHA-256 of the canonical JSON of that evidence, so a decision signed on one picture of
the case cannot be applied to another.

A reviewer signs ``replan``, ``keep`` or ``abort`` for one case fingerprint with a one-time nonce
(Ed25519, a key in the approvers registry). The decision is journaled (``review_decided``
and ``run_thawed``, one commit) and consumed when the resumed workflow reaches the act:

1. the tool's authoritative receipt for the old operation id is re-read (``lookup``);
   if it differs from the case's (another receipt id or intent digest, found where the
   case had none, or cannot be read), the run freezes again with the reason — a new case
   that supersedes the old one — and nothing executes;
2. ``review_consumed`` is journaled (the nonce, and for a replan the quarantined
   operation ids and the new epoch);
3. ``replan``: the old operation id is never used again; the act runs under a new epoch
   (``run/step@2``) with the intent the code produces now, under the normal act protocol.
   ``keep``: nothing is sent again; the act is recorded as not done (``cp.ActNotDone``,
   as for a tool declaring ``at_most_once``) and the run goes on. Only for a case whose
   target showed no receipt (an unknown outcome, drift): a receipt held under another
   intent is not this act's, and cannot be kept.
   ``abort``: the run fails (``run_failed``), every record kept as evidence.

A crash between 2 and 3 resumes from the consumption: the same epoch, nothing re-read or
re-decided. A case that is not at an in-flight act (a replayed step that changed) can
only be aborted, and that is consumed at once (nothing to re-read).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashproof.errors import CrashproofError
from crashproof.integrity.signing import key_fingerprint, sign_statement, verify_statement
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.guards.approvals import consumed_nonces
from crashproof.runtime.guards.approvers import Approver

__all__ = [
    "DECISIONS",
    "DECISION_TYPE",
    "ReviewCase",
    "case_events",
    "cases_of",
    "check_decision",
    "sign_decision",
    "verify_decision",
]

DECISION_TYPE = "crashproof.review-decision/1"
DECISIONS = ("replan", "keep", "abort", "continue")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewCase:
    """One needs_review freeze and its evidence. ``state``: ``open`` (the run waits on
    it), ``decided`` (a decision waits to be consumed on resume), ``resolved`` (consumed),
    ``superseded`` (the run moved on: thawed and frozen again, or a retryable freeze
    lifted by a resume)."""

    case_id: str
    run_id: str
    seq: int
    key: str | None
    reason: str
    state: str
    fingerprint: str
    evidence: dict[str, Any]  # everything the fingerprint covers
    decision: dict[str, Any] | None = None  # the signed decision, once there is one
    # The workflow and policy versions the run was driven under when it froze: a decision
    # binds them, and is consumed only by a drive under the same ones.
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def replannable(self) -> bool:
        """Frozen by the protocol of an act in flight (conflict, drift, unknown outcome,
        another intent), so the resumed code reaches that act again: it can be replanned,
        and a decision is consumed there, after the receipt is re-read. Any other case
        (a replayed step changed, the code no longer reaches the act in flight) can only
        be aborted, at once."""
        frozen = self.evidence.get("frozen") or {}
        return (
            self.key is not None
            and bool(self.evidence.get("pending_intent"))
            and "operation_id" in frozen
        )

    @property
    def imported_copy(self) -> bool:
        """Opened by importing a copy (``crashproof.runtime.operations.transfer``): a ``continue``
        decision (the reviewer knows the source did not go on) lifts it, consumed at once."""
        return "imported_copy" in (self.evidence.get("frozen") or {})

    @property
    def keepable(self) -> bool:
        """At an act in flight whose target showed no receipt: ``keep`` records it as
        not done. A receipt (held under another intent, or unbound) is evidence of an
        effect that is not provably this act's: replan or abort it."""
        return self.replannable and self.evidence.get("receipt") is None

    @property
    def no_lookup(self) -> bool:
        """Frozen because the act's tool cannot look its outcome up: a replan decides on
        the journal's evidence alone (``no_reread``)."""
        return bool((self.evidence.get("frozen") or {}).get("no_lookup"))

    @property
    def decisions(self) -> list[str]:
        """The decisions this case accepts."""
        if self.imported_copy:
            return ["continue", "abort"]
        if not self.replannable:
            return ["abort"]
        return ["replan", "keep", "abort"] if self.keepable else ["replan", "abort"]

    def to_json(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "run_id": self.run_id,
            "seq": self.seq,
            "key": self.key,
            "state": self.state,
            "reason": self.reason,
            "fingerprint": self.fingerprint,
            "decisions": self.decisions,
            "decision": self.decision,
            "evidence": self.evidence,
        }


def _receipt_fingerprint(receipt: Any) -> str | None:
    if not isinstance(receipt, dict):
        return None
    return canonical_digest(receipt, what="a receipt")


def _case(events: list[Event], freeze: Event) -> dict[str, Any]:
    """The evidence of the case opened by ``freeze`` (covered by its fingerprint)."""
    p = payloads.run_frozen(freeze)
    evidence = p.get("evidence") or {}
    key = freeze.key
    trace = [
        {"seq": e.seq, "type": e.type.value, "payload": e.payload, "value": e.value}
        for e in events[: freeze.seq]
        if key is not None and e.key == key
    ]
    intents = [e for e in events[: freeze.seq] if e.key == key and e.type is EventType.ACT_INTENT]
    done = any(e.key == key and e.type is EventType.STEP_DONE for e in events[: freeze.seq])
    pending = None
    if intents and not done:
        last = intents[-1]
        pending = {"seq": last.seq, **last.payload, **(last.value or {})}
    receipt = evidence.get("receipt")
    return {
        "run_id": freeze.run_id,
        "seq": freeze.seq,
        "generation": freeze.seq + 1,
        "key": key,
        "reason": p.get("reason"),
        "error": p.get("error"),
        "retryable": bool(p.get("retryable")),
        "frozen": evidence,
        "pending_intent": pending,
        "digests": {
            "journal": (pending or {}).get("intent_digest", evidence.get("journaled_digest")),
            "receipt": (receipt or {}).get("intent_digest") if isinstance(receipt, dict) else None,
            "code": evidence.get("code_digest"),
        },
        "receipt": receipt,
        "receipt_fingerprint": _receipt_fingerprint(receipt),
        "trace": trace,
    }


def cases_of(events: list[Event]) -> list[ReviewCase]:
    """Every review case of a run, oldest first."""
    if not events:
        return []
    last_outcome = None
    for event in events:
        if event.type in (
            EventType.RUN_FROZEN,
            EventType.RUN_SUCCEEDED,
            EventType.RUN_FAILED,
            EventType.RUN_STOPPED,
            EventType.RUN_THAWED,
            EventType.RUN_RETRIED,
        ):
            last_outcome = event
    decided = {
        payloads.review_decided(e).get("case_id"): e
        for e in events
        if e.type is EventType.REVIEW_DECIDED
    }
    consumed = {
        payloads.review_consumed(e).get("case_id")
        for e in events
        if e.type is EventType.REVIEW_CONSUMED
    }
    out = []
    started = payloads.run_started(events[0]) if events else None
    versions: dict[str, str | None] = {
        "workflow": None if started is None else started.get("version"),
        "policy": None if started is None else (started.get("policy") or {}).get("version"),
    }
    for event in events:
        session = payloads.drive_record(event).get("session")
        if isinstance(session, dict):  # each drive names the versions it runs under
            versions = {
                "workflow": session.get("workflow_version"),
                "policy": session.get("policy_version"),
            }
        if (
            event.type is not EventType.RUN_FROZEN
            or payloads.run_frozen(event).get("status") != RunStatus.NEEDS_REVIEW.value
        ):
            continue
        case_id = f"{event.run_id}#{event.seq}"
        evidence = _case(events, event)
        decision = decided.get(case_id)
        if case_id in consumed:
            state = "resolved"
        elif decision is not None and not _refrozen_after(events, decision):
            state = "decided"
        elif event is last_outcome:
            state = "open"
        else:
            state = "superseded"
        out.append(
            ReviewCase(
                case_id=case_id,
                run_id=event.run_id,
                seq=event.seq,
                key=event.key,
                reason=str(payloads.run_frozen(event).get("reason", "")),
                state=state,
                fingerprint=canonical_digest(evidence, what=f"review case {case_id}"),
                evidence=evidence,
                decision=None
                if decision is None
                else payloads.review_decided(decision).get("decision"),
                versions=dict(versions),
            )
        )
    return out


def _refrozen_after(events: list[Event], decision: Event) -> bool:
    return any(e.type is EventType.RUN_FROZEN for e in events[decision.seq + 1 :])


def sign_decision(
    key: Ed25519PrivateKey,
    reviewer: str,
    case: ReviewCase,
    decision: str,
    *,
    now: float | None = None,
    nonce: str | None = None,
    no_reread: bool = False,
) -> dict[str, Any]:
    """A signed decision document (``{"statement": ..., "signature": ...}``). ``no_reread``:
    the reviewer states that the receipt cannot be re-read (a tool without lookup) and
    decides on the case's evidence alone; a replan needs it for such a tool."""
    statement: dict[str, Any] = {
        "type": DECISION_TYPE,
        "case_id": case.case_id,
        "run_id": case.run_id,
        "case_fingerprint": case.fingerprint,
        "decision": decision,
        "reviewer": reviewer,
        "key_fingerprint": key_fingerprint(key.public_key()),
        "issued_at": time.time() if now is None else now,
        "nonce": nonce or secrets.token_hex(16),
    }
    if no_reread:  # only when stated: earlier statements stay byte for byte as they were
        statement["no_reread"] = True
    statement["versions"] = dict(case.versions)
    return {"statement": statement, "signature": sign_statement(key, statement)}


def check_decision(
    document: Any, case: ReviewCase, registry: dict[str, Approver], events: list[Event]
) -> str | None:
    """Why ``document`` cannot decide ``case`` now; None if it can."""
    problem = verify_decision(document, case, registry)
    if problem is not None:
        return problem
    nonce = document["statement"]["nonce"]
    used = consumed_nonces(events)
    decided = [e for e in events if e.type is EventType.REVIEW_DECIDED]
    if nonce in used or any(
        payloads.review_decided(e)["decision"]["statement"]["nonce"] == nonce for e in decided
    ):
        return f"its nonce {nonce} was already used in this run"
    if case.state != "open":
        return f"case {case.case_id} is {case.state}, not open"
    return None


def verify_decision(document: Any, case: ReviewCase, registry: dict[str, Approver]) -> str | None:
    """Why ``document`` is not a valid signed decision on ``case``: signer, signature,
    case binding and fingerprint, decision (checked again when it is consumed)."""
    if not isinstance(document, dict) or not isinstance(document.get("statement"), dict):
        return "not a decision document ({statement, signature})"
    statement: dict[str, Any] = document["statement"]
    if statement.get("type") != DECISION_TYPE:
        return f"not a review decision (type {statement.get('type')!r})"
    name = statement.get("reviewer")
    reviewer = registry.get(name) if isinstance(name, str) else None
    if reviewer is None:
        return (
            f"unknown signer {name!r}: not in the approvers registry "
            f"(registered: {', '.join(sorted(registry)) or 'none'})"
        )
    signature = document.get("signature")
    if not isinstance(signature, str) or not verify_statement(
        reviewer.public_key, statement, signature
    ):
        return (
            f"the signature does not verify with {name!r}'s registered key "
            f"{reviewer.fingerprint[:16]}…: the statement was altered or signed by another key"
        )
    if statement.get("run_id") != case.run_id or statement.get("case_id") != case.case_id:
        return f"it decides case {statement.get('case_id')!r}, not {case.case_id!r}"
    if statement.get("versions") != case.versions:
        return (
            f"it was signed for workflow/policy versions {statement.get('versions')}, the case "
            f"froze under {case.versions}: review it again"
        )
    if statement.get("case_fingerprint") != case.fingerprint:
        return (
            f"it was signed on case fingerprint {statement.get('case_fingerprint')}, the "
            f"case's evidence now has fingerprint {case.fingerprint}: review it again"
        )
    decision = statement.get("decision")
    if decision not in DECISIONS:
        return f"unknown decision {decision!r} (use {' or '.join(DECISIONS)})"
    if decision == "replan" and not case.replannable:
        return (
            "replan needs a case raised by an act in flight (an operation id to quarantine, "
            f"an act the code reaches again); case {case.case_id} is not: abort it, or "
            "deploy code that replays the run"
        )
    if decision not in case.decisions:
        why = {
            "continue": ": continue lifts only a run imported from a copy",
            "keep": ": the target holds a receipt that is not provably this act's",
        }
        return (
            f"case {case.case_id} accepts {' or '.join(case.decisions)}, not {decision!r}"
            + why.get(str(decision), "")
        )
    nonce = statement.get("nonce")
    if not isinstance(nonce, str) or not nonce:
        return "it has no nonce"
    return None


def case_events(events: list[Event], key: str) -> tuple[Event | None, Event | None]:
    """For act ``key``: the latest decision not yet superseded by a freeze, and its
    consumption (if any)."""
    decision = consumed = None
    for event in events:
        if event.key != key:
            continue
        if event.type is EventType.REVIEW_DECIDED:
            decision, consumed = event, None
        elif event.type is EventType.REVIEW_CONSUMED and decision is not None:
            consumed = event
    if decision is not None and consumed is None and _refrozen_after(events, decision):
        decision = None  # the re-read found drift: that decision is spent
    return decision, consumed


def abort_events(run_id: str, seq: int, case: ReviewCase, document: dict[str, Any]) -> list[Event]:
    """A decided abort of a case that is not at an act: decision, consumption and the
    run's failure, to commit at once (nothing to re-read)."""
    reviewer = document["statement"]["reviewer"]
    message = f"aborted by {reviewer} on review case {case.case_id}"
    error = {"type": "ReviewAborted", "message": message}
    return _consumed_then(
        run_id,
        seq,
        case,
        document,
        "abort",
        EventType.RUN_FAILED,
        lambda consumed: payloads.as_dict(payloads.RunFailed(error=error, review=consumed)),
    )


def continue_events(
    run_id: str, seq: int, case: ReviewCase, document: dict[str, Any]
) -> list[Event]:
    """A decided ``continue`` of an imported copy: consumed at once (nothing to re-read:
    the reviewer vouches that the source did not go on), and the run thawed."""
    reviewer = document["statement"]["reviewer"]
    return _consumed_then(
        run_id,
        seq,
        case,
        document,
        "continue",
        EventType.RUN_THAWED,
        lambda _consumed: payloads.as_dict(
            payloads.RunThawed(status="running", by=reviewer, decision_seq=seq)
        ),
    )


def _consumed_then(
    run_id: str,
    seq: int,
    case: ReviewCase,
    document: dict[str, Any],
    decision: str,
    then: EventType,
    then_payload: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[Event]:
    """A decision consumed at once (``review_consumed`` at ``seq + 1``), followed by the
    record that carries it out (``then`` at ``seq + 2``, its payload built from the
    consumption)."""
    statement = document["statement"]
    now = time.time()
    built: payloads.ReviewConsumed = {
        "case_id": case.case_id,
        "case_fingerprint": case.fingerprint,
        "decision": decision,
        "nonce": statement["nonce"],
        "reviewer": statement["reviewer"],
        "epoch": 1,
        "quarantined": [],
        "time": now,
    }
    consumed = payloads.as_dict(built)
    return [
        Event(run_id, seq + 1, EventType.REVIEW_CONSUMED, case.key, consumed, now),
        Event(run_id, seq + 2, then, None, then_payload(consumed), now),
    ]


def refuse(reason: str, what: str) -> CrashproofError:
    return CrashproofError(f"{what} refused: {reason}; nothing was journaled or executed")
