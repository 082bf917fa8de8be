"""Signed approvals of pending acts: what they bind, how they are checked, and how one is
consumed exactly once.

An act whose risk needs an approval stops the run in ``awaiting_approval`` (a
``run_frozen`` record holding the pending act; ``crashproof.runtime.guards.policy``). An
approval is a statement signed with a registered approver's Ed25519 key
(``crashproof.runtime.guards.approvers``) binding:

- ``run_id``, ``step``, ``operation_id``, ``intent_digest`` — exactly that act;
- ``generation`` — the run's journal generation at the ``awaiting_approval`` record the
  approver saw (its seq + 1), and ``environment_fingerprint`` — the pending act's
  observation of its target when its tool provides one (None until then);
- ``policy`` — version and digest of the policy that asked for it;
- ``expires_at``, a one-time ``nonce``, and the ``approver`` (name and key fingerprint).

It is journaled into the run (``approval_granted``: the document plus who submitted it,
host, time) together with a ``run_thawed`` record, in one commit, once every check
below passes. When the resumed workflow reaches the act again, ``approval_for`` checks
it again against the act the code produces *now* — signature against the registry as it
is now, every binding, expiry, nonce unused — and journals ``approval_consumed`` (the
nonce) *before* the act's intent commits; then the act runs under the normal protocol,
exactly once. Anything that does not check out is never executed: the act freezes
again, ``awaiting_approval``, and the refused approvals with their reasons are the
freeze's evidence (``crashproof show``).

Expiry is checked against the ledger's clock (``RunSession.ledger_now``: the server's
on PostgreSQL, the host's kept monotonic across the ledger's commits on SQLite), never
the host's clock alone, and an approval expiring within ``ActSettings.max_clock_skew``
of it counts as expired. It is checked when the approval is consumed *and* right before
every execution of the act (steps/acts.py): a consumed approval does expire. An act
whose approval expired before its effect was sent freezes ``awaiting_approval`` again
(``steps/expiry.py``): nothing executes until a fresh approval of the same act. A
resume after the expiry looks the act up first: not found, it waits for that fresh
approval; found, its receipt must prove the commit came before the expiry
(``committed_at``; a tool private to the runtime: the receipt's own time), else review.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from crashproof.integrity.signing import key_fingerprint, sign_statement, verify_statement
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.guards.approvers import REGISTRY_RUN, Approver, registry_of
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.expiry import lapsed

__all__ = [
    "APPROVAL_TYPE",
    "MAX_TTL",
    "approval_for",
    "awaiting",
    "check_approval",
    "consumed_nonces",
    "expectation",
    "sign_approval",
]

APPROVAL_TYPE = "crashproof.approval/1"
_BOUND = ("run_id", "step", "operation_id", "intent_digest")
MAX_TTL = 30 * 86400.0  # an approval outliving a month is not an approval of an act now


def awaiting(events: list[Event], step: str | None = None) -> Event | None:
    """The latest ``awaiting_approval`` freeze (of ``step``), None when there is none."""
    event: Event
    for event in reversed(events):
        if (
            event.type is EventType.RUN_FROZEN
            and payloads.run_frozen(event).get("status") == RunStatus.AWAITING_APPROVAL.value
            and (step is None or event.key == step)
        ):
            return event
    return None


def expectation(freeze: Event) -> dict[str, Any]:
    """What an approval of the act pending at ``freeze`` must bind."""
    payloads.expect(freeze, EventType.RUN_FROZEN)
    pending = (payloads.run_frozen(freeze).get("evidence") or {}).get("pending_act") or {}
    policy = pending.get("policy") or {}
    return {
        "run_id": pending.get("run_id", freeze.run_id),
        "step": pending.get("step", freeze.key),
        "operation_id": pending.get("operation_id"),
        "intent_digest": pending.get("intent_digest"),
        "generation": freeze.seq + 1,
        "environment_fingerprint": pending.get("environment_fingerprint"),
        "policy": {"version": policy.get("version"), "digest": policy.get("digest")},
    }


def sign_approval(
    key: Ed25519PrivateKey,
    approver: str,
    expect: dict[str, Any],
    *,
    ttl: float,
    now: float | None = None,
    nonce: str | None = None,
) -> dict[str, Any]:
    """A signed approval document (``{"statement": ..., "signature": ...}``)."""
    if not 0 < ttl <= MAX_TTL:
        raise ValueError(
            f"an approval needs a time to live from 1 s to {MAX_TTL / 86400:.0f} days, "
            f"not {ttl!r} s; nothing was signed"
        )
    issued = time.time() if now is None else now
    statement = {
        "type": APPROVAL_TYPE,
        **expect,
        "approver": approver,
        "key_fingerprint": key_fingerprint(key.public_key()),
        "issued_at": issued,
        "expires_at": issued + ttl,
        "nonce": nonce or secrets.token_hex(16),
    }
    return {"statement": statement, "signature": sign_statement(key, statement)}


def consumed_nonces(events: list[Event]) -> dict[str, Event]:
    """Nonces already used in this run (approvals and review decisions), by nonce."""
    used: dict[str, Event] = {}
    for event in events:
        if event.type in (EventType.APPROVAL_CONSUMED, EventType.REVIEW_CONSUMED):
            used[str(payloads.consumption(event).get("nonce"))] = event
    return used


def check_approval(
    document: Any,
    expect: dict[str, Any],
    registry: dict[str, Approver],
    used: dict[str, Event],
    now: float,
) -> str | None:
    """Why ``document`` does not approve the act ``expect`` describes; None if it does."""
    if not isinstance(document, dict) or not isinstance(document.get("statement"), dict):
        return "not an approval document ({statement, signature})"
    statement: dict[str, Any] = document["statement"]
    signature = document.get("signature")
    if statement.get("type") != APPROVAL_TYPE:
        return f"not an approval statement (type {statement.get('type')!r})"
    name = statement.get("approver")
    approver = registry.get(name) if isinstance(name, str) else None
    if approver is None:
        return (
            f"unknown signer {name!r}: not in the approvers registry "
            f"(registered: {', '.join(sorted(registry)) or 'none'})"
        )
    if not isinstance(signature, str) or not verify_statement(
        approver.public_key, statement, signature
    ):
        return (
            f"the signature does not verify with {name!r}'s registered key "
            f"{approver.fingerprint[:16]}…: the statement was altered or signed by another key"
        )
    for field in _BOUND:
        if statement.get(field) != expect.get(field):
            return (
                f"it approves {field.replace('_', ' ')} {statement.get(field)!r}, but the "
                f"pending act has {expect.get(field)!r}"
            )
    if statement.get("policy") != expect.get("policy"):
        return f"it binds policy {statement.get('policy')}, the act waits under {expect['policy']}"
    if statement.get("generation") != expect.get("generation"):
        return (
            f"it was made at generation {statement.get('generation')}, but the act waits "
            f"at generation {expect.get('generation')} (the run changed since): approve again"
        )
    if statement.get("environment_fingerprint") != expect.get("environment_fingerprint"):
        return (
            f"it saw environment {statement.get('environment_fingerprint')!r}, the act "
            f"now observes {expect.get('environment_fingerprint')!r}"
        )
    nonce = statement.get("nonce")
    if not isinstance(nonce, str) or not nonce:
        return "it has no nonce"
    if nonce in used:
        return f"its nonce {nonce} was already consumed (journal record {used[nonce].seq})"
    expires = statement.get("expires_at")
    late = lapsed(expires, now, 0.0)
    if late is not None:
        return f"it {late}: sign a fresh approval for the same act"
    issued = statement.get("issued_at")
    if not isinstance(issued, int | float) or float(expires or 0) - issued > MAX_TTL:
        return (
            f"it is valid for more than {MAX_TTL / 86400:.0f} days (issued {issued!r}, "
            f"expires {expires!r}): sign one with a shorter time to live"
        )
    return None


def binding(consumed: dict[str, Any]) -> dict[str, Any]:
    """What an act carries of the approval it consumed (``Call.approval``): the signed
    statement's digest, its expiry and the approver."""
    return {
        "digest": consumed.get("statement_digest"),
        "expires_at": consumed.get("expires_at"),
        "approver": consumed.get("approver"),
    }


def approval_in_flight(session: RunSession, key: str, digest: str) -> dict[str, Any] | None:
    """The binding of the approval an act in flight consumed before its intent (None:
    it needed none). Expired or not: the act protocol looks the act up before anything
    else and never executes it past the expiry (steps/acts.py)."""
    consumed = _consumed(session.journal(), key, digest)
    return None if consumed is None else binding(dict(consumed.payload))


def renewable(session: RunSession, key: str, digest: str) -> bool:
    """Whether the act in flight ``key`` froze for a fresh approval after the one it
    consumed expired (``steps/expiry.py``): then ``approval_for`` may consume another."""
    events = session.journal()
    consumed = _consumed(events, key, digest)
    freeze = awaiting(events, key)
    return consumed is not None and freeze is not None and freeze.seq > consumed.seq


def _consumed(events: list[Event], key: str, digest: str) -> Event | None:
    """The approval consumed for act ``key`` with intent ``digest``, if any (the last)."""
    for event in reversed(events):
        if (
            event.type is EventType.APPROVAL_CONSUMED
            and event.key == key
            and payloads.approval_consumed(event).get("intent_digest") == digest
        ):
            return event
    return None


def approval_for(
    session: RunSession,
    key: str,
    digest: str,
    expect_policy: dict[str, Any],
    environment: str | None = None,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The approval that lets the act ``key`` (intent ``digest``) run now, consumed
    (journaled) before returning; else None and the approvals refused, with reasons."""
    events = session.journal()
    now, skew = session.ledger_now(), session.act_settings.max_clock_skew
    refused: list[dict[str, Any]] = []
    found = _consumed(events, key, digest)  # then a crash before the intent: go on
    if found is not None:
        late = lapsed(found.payload.get("expires_at"), now, skew)
        if late is None:
            return dict(found.payload), []
        refused.append(
            {
                "seq": found.seq,
                "reason": f"it was consumed, but {late} before the act executed: approve again",
                "approval": None,
            }
        )
    freeze = awaiting(events, key)
    if freeze is None:
        return None, refused  # never asked: the act must wait first
    expect = expectation(freeze)
    # The act the code produces now, not the one that was pending: another intent or
    # another policy under the same step is not what anyone approved.
    # Nor is the same act against a target that changed since the approver looked.
    expect.update(intent_digest=digest, policy=expect_policy, environment_fingerprint=environment)
    registry = registry_of(session.journal(REGISTRY_RUN))
    used = consumed_nonces(events)
    for event in reversed(events):
        if event.type is not EventType.APPROVAL_GRANTED or event.key != key:
            continue
        document: Any = payloads.approval_granted(event).get("approval")
        reason = check_approval(document, expect, registry, used, now + skew)
        if reason is None:
            statement = document["statement"]
            built: payloads.ApprovalConsumed = {
                "nonce": statement["nonce"],
                "approver": statement["approver"],
                "approval_seq": event.seq,
                "statement_digest": canonical_digest(statement, what="an approval"),
                "operation_id": statement["operation_id"],
                "intent_digest": digest,
                "time": now,
                "expires_at": statement.get("expires_at"),
            }
            consumed = payloads.as_dict(built)
            session.append_event(EventType.APPROVAL_CONSUMED, key, consumed)
            return consumed, []
        statement = document.get("statement") if isinstance(document, dict) else None
        refused.append({"seq": event.seq, "reason": reason, "approval": statement})
    return None, refused
