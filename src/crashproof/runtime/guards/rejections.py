"""Signed rejections of pending acts: the "no" beside an approval's "yes".

A run stopped in ``awaiting_approval`` (``runtime.guards.policy``) waits for a person.
An approval releases the act; a rejection refuses it for good, with a reason. A
rejection is a statement signed with a registered approver's Ed25519 key binding
exactly the pending act, as an approval does (``runtime.guards.approvals``): ``run_id``,
``step``, ``operation_id``, ``intent_digest``, ``generation`` (the freeze's seq + 1)
and ``policy``, plus the ``reason``, the ``approver`` (name and key fingerprint), the
time and a nonce. It never expires: a "no" does not lapse.

It is journaled (``approval_rejected``: the document plus who submitted it, host,
time) together with a ``run_thawed`` record, in one commit, only while the run stands
on that freeze; an approval or a rejection already journaled for it thawed the run, so
the second one is refused (nothing written). The run is then ``running``: a worker or
a resume drives it on, and when the workflow reaches the act again ``rejection_for``
finds the rejection (its signature checked against the registry as it is now, every
binding against the act the code produces now). The act is then journaled as its
step's outcome, a failed step whose failure is ``rejected``, and ``cp.ApprovalRejected``
(an ``ApprovalRefused`` and an ``ActFailed``) is raised into the workflow with the
approver and the reason; nothing of the act was
executed, and replay raises the same error. A workflow may catch it (hand it to its
model, take another path); left uncaught, the run fails with the reason.

A rejection applies where an approval would: to the act the policy asks an approval
for. Code that now produces another act under that step (another intent) is not what
was rejected, and waits for its own approval or rejection.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, NoReturn

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashproof.errors import ApprovalRefused, ApprovalRejected
from crashproof.integrity.signing import key_fingerprint, sign_statement, verify_statement
from crashproof.journal import payloads
from crashproof.journal.codec import error_record
from crashproof.journal.records import Event, EventType, StepKind, StepStatus
from crashproof.runtime.guards.approvers import REGISTRY_RUN, Approver, registry_of
from crashproof.runtime.port import RunSession

__all__ = [
    "REJECTED",
    "REJECTION_TYPE",
    "check_rejection",
    "refuse_rejected",
    "rejection_for",
    "sign_rejection",
]

REJECTION_TYPE = "crashproof.rejection/1"
REJECTED = "rejected"  # the failure class of a rejected act's step
_BOUND = ("run_id", "step", "operation_id", "intent_digest")
MAX_REASON = 2000  # characters: a reason is a sentence or a paragraph, not a document


def sign_rejection(
    key: Ed25519PrivateKey,
    approver: str,
    expect: dict[str, Any],
    reason: str,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """A signed rejection document (``{"statement": ..., "signature": ...}``) of the act
    ``expect`` describes (``approvals.expectation``), with ``reason``."""
    text = reason.strip()
    if not text or len(text) > MAX_REASON:
        raise ApprovalRefused(
            f"a rejection needs a reason of 1 to {MAX_REASON} characters, not "
            f"{len(text)}; nothing was signed or journaled"
        )
    statement = {
        "type": REJECTION_TYPE,
        **{k: expect.get(k) for k in (*_BOUND, "generation", "policy")},
        "reason": text,
        "approver": approver,
        "key_fingerprint": key_fingerprint(key.public_key()),
        "issued_at": time.time() if now is None else now,
        "nonce": secrets.token_hex(16),
    }
    return {"statement": statement, "signature": sign_statement(key, statement)}


def check_rejection(
    document: Any, expect: dict[str, Any], registry: dict[str, Approver]
) -> str | None:
    """Why ``document`` does not reject the act ``expect`` describes; None if it does.
    ``expect``: the binding fields (``generation`` and ``policy`` checked when given)."""
    if not isinstance(document, dict) or not isinstance(document.get("statement"), dict):
        return "not a rejection document ({statement, signature})"
    statement: dict[str, Any] = document["statement"]
    if statement.get("type") != REJECTION_TYPE:
        return f"not a rejection statement (type {statement.get('type')!r})"
    name = statement.get("approver")
    approver = registry.get(name) if isinstance(name, str) else None
    if approver is None:
        return f"unknown signer {name!r}: not in the approvers registry"
    signature = document.get("signature")
    if not isinstance(signature, str) or not verify_statement(
        approver.public_key, statement, signature
    ):
        return f"the signature does not verify with {name!r}'s registered key"
    for field in (*_BOUND, "generation", "policy"):
        if field in expect and statement.get(field) != expect[field]:
            return (
                f"it rejects {field.replace('_', ' ')} {statement.get(field)!r}, but the "
                f"pending act has {expect[field]!r}"
            )
    reason = statement.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        return "it gives no reason"
    return None


def rejection_for(session: RunSession, key: str, digest: str) -> Event | None:
    """The journaled rejection of act ``key`` with intent ``digest`` that checks out
    (signature against the registry as it is now, every binding), the latest; None when
    there is none."""
    registry: dict[str, Approver] | None = None
    expect = {"run_id": session.run_id, "step": key, "intent_digest": digest}
    for event in reversed(session.journal()):
        if event.type is not EventType.APPROVAL_REJECTED or event.key != key:
            continue
        if registry is None:
            registry = registry_of(session.journal(REGISTRY_RUN))
        document = payloads.approval_rejected(event).get("rejection")
        expect["operation_id"] = f"{session.run_id}/{key}"
        if check_rejection(document, expect, registry) is None:
            return event
    return None


def refuse_rejected(session: RunSession, key: str, digest: str, rejected: Event) -> NoReturn:
    """Journal act ``key`` as refused by ``rejected`` (its step's outcome: failed,
    ``rejected``) and raise ``cp.ApprovalRejected`` into the workflow."""
    statement = payloads.approval_rejected(rejected)["rejection"]["statement"]
    exc = ApprovalRejected(
        f"act {key!r} was rejected by {statement['approver']}: {statement['reason']}; "
        "nothing was executed"
    )
    now = time.time()
    done = payloads.StepDone(
        kind=StepKind.ACT.value,
        digest=digest,
        status=StepStatus.FAILED.value,
        failure=REJECTED,
        attempt=0,  # never attempted
        operation_id=f"{session.run_id}/{key}",
        intent_digest=digest,
        error=error_record(exc),
        started_at=now,
        ended_at=now,
    )
    done["rejected"] = {
        "seq": rejected.seq,
        "approver": statement["approver"],
        "reason": statement["reason"],
    }
    session.append_event(EventType.STEP_DONE, key, payloads.as_dict(done))
    raise exc
