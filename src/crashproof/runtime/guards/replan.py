"""Consuming a signed review decision when its run resumes: the receipt is re-read
first (every field; a change keeps the case frozen, with the new evidence), then a
replan runs the act under a new epoch with the earlier operation ids quarantined, a keep
records the act as not done (``steps/unknown.py``) and goes on, and an abort fails the
run. The cases and the signed decisions themselves: ``review``.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from crashproof._excerpt import shown
from crashproof.errors import CrashproofError, DriftError, RunFailed
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest
from crashproof.journal.records import Event, EventType
from crashproof.runtime.guards.approvers import REGISTRY_RUN, registry_of
from crashproof.runtime.guards.review import ReviewCase, case_events, cases_of, verify_decision
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.environment import environment_fingerprint
from crashproof.runtime.steps.handoff import Invoke, Work
from crashproof.runtime.steps.unknown import record_not_done
from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["decided_epoch"]


def decided_epoch(
    session: RunSession, key: str, tool: Tool, digest: str
) -> Work[tuple[int, list[Event]] | None]:
    """For an act in flight whose case was decided: consume the decision (re-reading the
    receipt first) and return the epoch to run it under with that epoch's open records;
    keep records the act (``digest``: the intent the code makes now) as not done and
    raises ``cp.ActNotDone``; abort fails the run. None when no decision applies."""
    events = session.journal()
    decision, consumed = case_events(events, key)
    if decision is None:
        return None
    statement = payloads.review_decided(decision)["decision"]["statement"]
    if consumed is None:
        case = next((c for c in cases_of(events) if c.case_id == statement["case_id"]), None)
        if case is None:
            raise CrashproofError(
                f"run {session.run_id!r}: a decision names review case {statement['case_id']!r}, "
                "which its journal does not hold; nothing was executed"
            )
        problem = verify_decision(
            payloads.review_decided(decision)["decision"],
            case,
            registry_of(session.journal(REGISTRY_RUN)),
        )
        if problem is not None:  # e.g. the registry changed since: the case stays open
            _refreeze(
                session,
                key,
                case,
                f"the decision no longer verifies ({problem}); nothing was executed: review again",
            )
        if statement.get("versions") != session.versions:
            # Code or policy changed since the reviewer signed: decide again under them.
            _refreeze(
                session,
                key,
                case,
                f"the decision was signed for workflow/policy versions "
                f"{statement.get('versions')}, this drive runs {session.versions}; nothing "
                "was executed: review again",
            )
        frozen_in = (case.evidence.get("frozen") or {}).get("environment_fingerprint")
        replan = statement["decision"] == "replan"  # an abort runs nothing: always allowed
        seen_now = (yield from environment_fingerprint(tool)) if replan and frozen_in else None
        if replan and frozen_in is not None and seen_now != frozen_in:
            # The world the reviewer judged is gone: an act in flight without an expected
            # result passes the resume's environment check, so it is compared here.
            _refreeze(
                session,
                key,
                case,
                f"the environment {tool.name} acts on changed since the case froze; the "
                "decision was not applied and nothing was executed: review again",
                environment_fingerprint=seen_now,
            )
        if (
            statement["decision"] == "replan"
            and not tool.supports_lookup
            and statement.get("no_reread") is not True
        ):
            # Nothing authoritative to re-read: a replan goes on the journal's evidence
            # alone only when the reviewer signed exactly that.
            _refreeze(
                session,
                key,
                case,
                f"{tool.name} cannot look its receipt up, so it cannot be re-read before the "
                "replan, and the decision does not state that no re-read is possible; "
                "nothing was executed. Sign the replan again with no_reread=True (CLI: "
                "--no-reread) to decide on the journal's evidence alone",
            )
        seen, receipt = yield from _reread(session, key, tool, case)
        if seen is not None:
            _refreeze(
                session,
                key,
                case,
                f"the receipt changed since the decision was signed ({shown(seen)}); the "
                "decision was not applied and nothing was executed: review again",
                receipt=receipt,
                changed_since_decision=seen,  # whole: a tool's error may be 100 KB
            )
        epoch = _epoch(events, key) + (1 if statement["decision"] == "replan" else 0)
        quarantined = [_operation_id(session.run_id, key, n) for n in range(1, epoch)]
        payload: payloads.ReviewConsumed = {
            "case_id": case.case_id,
            "case_fingerprint": case.fingerprint,
            "decision": statement["decision"],
            "nonce": statement["nonce"],
            "reviewer": statement["reviewer"],
            "epoch": epoch,
            "quarantined": quarantined,
            "time": time.time(),
        }
        session.append_event(EventType.REVIEW_CONSUMED, key, payloads.as_dict(payload))
        consumed_seq = session.next_seq - 1
    else:
        payload = payloads.review_consumed(consumed)
        consumed_seq = consumed.seq
    if payload["decision"] == "abort":
        _abort(session, payloads.as_dict(payload))
    if payload["decision"] == "keep":
        _keep(session, key, tool, digest, payload, events)
    fresh = [
        e
        for e in events
        if e.seq > consumed_seq
        and e.key == key
        and e.type in (EventType.ACT_INTENT, EventType.ACT_UNKNOWN)
    ]
    return int(payload["epoch"]), fresh


def _operation_id(run_id: str, key: str, epoch: int) -> str:
    return f"{run_id}/{key}" if epoch <= 1 else f"{run_id}/{key}@{epoch}"


def _epoch(events: list[Event], key: str) -> int:
    """The epoch act ``key`` runs under now (1 until a replan is consumed)."""
    epoch = 1
    for event in events:
        if event.type is EventType.REVIEW_CONSUMED and event.key == key:
            epoch = int(payloads.review_consumed(event).get("epoch", epoch))
    return epoch


def _reread(
    session: RunSession, key: str, tool: Tool, case: ReviewCase
) -> Work[tuple[str | None, dict[str, Any] | None]]:
    """Re-read the tool's authoritative receipt for the case's operation: (None, _) when
    it is what the case holds, else (what changed, the receipt held now)."""
    pending = case.evidence.get("pending_intent") or {}
    if not tool.supports_lookup:
        return None, None  # nothing authoritative to re-read: decided on the journal's evidence
    call = Call(
        run_id=session.run_id,
        step=key,
        operation_id=str(pending.get("operation_id")),
        intent_digest=str(pending.get("intent_digest")),
        params=dict(pending.get("params") or {}),
        fencing_token=session.fencing_token,
        attempt=int(pending.get("attempt", 1)),
        prepared=pending.get("prepared"),
    )
    frozen = case.evidence.get("frozen") or {}
    try:
        found = yield Invoke(tool.lookup, (call,), f"lookup of tool {tool.name!r}")
    except DriftError as exc:
        return (None if "drift" in frozen else f"the target drifted ({exc})"), None
    except Exception as exc:
        return f"the receipt could not be re-read ({type(exc).__name__}: {exc})", None
    held = case.evidence.get("receipt")
    receipt = (
        None
        if not isinstance(found, Receipt)
        else {
            "receipt_id": found.receipt_id,
            "intent_digest": found.intent_digest,
            "result": found.result,
        }
    )
    # Every field of the receipt, its result included: a decision signed over one result
    # is not consumed over another (the seed: any drifted field keeps the case frozen).
    changed = _changed_fields(held if isinstance(held, dict) else None, receipt)
    if not changed:
        return None, receipt
    if receipt is None or not isinstance(held, dict):
        now = "nothing" if receipt is None else f"receipt {receipt['receipt_id']!r}"
        then = "nothing" if not isinstance(held, dict) else f"receipt {held.get('receipt_id')!r}"
        return f"{tool.name} now holds {now} for {call.operation_id!r}, the case had {then}", (
            receipt
        )
    return (
        f"{tool.name}'s receipt for {call.operation_id!r} changed: {', '.join(changed)} "
        "differ from the case's"
    ), receipt


_RECEIPT_FIELDS = ("receipt_id", "intent_digest", "result")


def _changed_fields(held: dict[str, Any] | None, now: dict[str, Any] | None) -> list[str]:
    """The receipt fields that differ (all of them when one side holds none); values are
    compared by their canonical digests (a journal's copy decoded, a tool's as made)."""
    if held is None or now is None:
        return [] if held is now else list(_RECEIPT_FIELDS)
    return [name for name in _RECEIPT_FIELDS if _digest(held.get(name)) != _digest(now.get(name))]


def _digest(value: Any) -> str | None:
    try:
        return canonical_digest(value, what="a receipt field")
    except CrashproofError:
        return None  # not JSON: never equal to what the case holds (a JSON copy)


def _refreeze(
    session: RunSession, key: str, case: ReviewCase, why: str, **evidence: Any
) -> NoReturn:
    """Freeze again: a new case, holding the case's evidence plus what is new, supersedes
    this one (its decision is spent)."""
    session.freeze(
        f"review case {case.case_id}: {why}",
        {**(case.evidence.get("frozen") or {}), "supersedes": case.case_id, **evidence},
        key=key,
    )


def _keep(
    session: RunSession,
    key: str,
    tool: Tool,
    digest: str,
    consumed: payloads.ReviewConsumed,
    events: list[Event],
) -> NoReturn:
    """The act recorded as not done, under the operation id the case froze on."""
    intents = [e for e in events if e.key == key and e.type is EventType.ACT_INTENT]
    last = payloads.act_intent(intents[-1]) if intents else None
    call = Call(
        run_id=session.run_id,
        step=key,
        operation_id=_operation_id(session.run_id, key, int(consumed["epoch"]))
        if last is None
        else str(last["operation_id"]),
        intent_digest=digest,
        params={},
        attempt=1 if last is None else int(last["attempt"]),
    )
    record_not_done(
        session,
        call,
        tool,
        f"{consumed['reviewer']} decided keep on review case {consumed['case_id']}",
        None,
        case_id=consumed["case_id"],
        reviewer=consumed["reviewer"],
    )


def _abort(session: RunSession, consumed: dict[str, Any]) -> NoReturn:
    review = payloads.of(payloads.ReviewConsumed, consumed)
    error = {
        "type": "ReviewAborted",
        "message": f"aborted by {review['reviewer']} on review case {review['case_id']}",
    }
    exc = RunFailed(session.run_id, error)
    session.finish(
        EventType.RUN_FAILED,
        payloads.as_dict(payloads.RunFailed(error=error, review=consumed)),
        None,
    )
    session.halt(exc)  # nothing more runs in this drive, whatever the workflow catches
    raise exc
