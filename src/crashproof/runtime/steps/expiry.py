"""An approved act and its approval's expiry, at execution (seed 001: an expired pending
action stays frozen, its evidence shown, not executed; a fresh exact approval is needed).

The clock is the ledger's (``RunSession.ledger_now``: PostgreSQL's server clock; on
SQLite this host's, kept monotonic across the ledger's commits), and an approval that
expires within ``ActSettings.max_clock_skew`` of it counts as expired: a host whose
clock runs behind gains nothing by it where the ledger's clock is the server's, and at
most the configured skew elsewhere.

- :func:`before_execution`: right before every ``tool.execute`` of an approved act (the
  first, a retry, a re-execution after a lookup found nothing): past the expiry, the act
  freezes ``awaiting_approval`` with the same pending act as its first freeze, so that
  an approver signs a fresh approval of exactly it; nothing is sent. A consumed approval
  is no exception: consumed in time, it still expires before the effect is sent.
- :func:`check_receipt`: the receipt of an approved act (executed or found by a lookup)
  proves its commit came before the expiry, or it goes to review: a commit time
  (``Receipt.committed_at``, the target's clock) after it; a shared tool's receipt that
  does not bind the approval, or that carries no commit time; a private tool's receipt
  (no other caller can reach its target: the commit is the act's own) taken after it by
  the ledger's clock. Nothing else executes; a human judges.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from typing import Any, NoReturn

from crashproof.errors import ApprovalRequired
from crashproof.journal import payloads
from crashproof.journal.codec import error_record
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.handoff import Work
from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["await_approval", "before_execution", "check_receipt", "lapsed"]

Evidence = Callable[[Call, Tool], Work[dict[str, Any]]]  # an act's, as acts.py builds it


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def lapsed(expires_at: Any, now: float, skew: float) -> str | None:
    """Why an approval expiring at ``expires_at`` no longer covers an execution at the
    ledger's ``now`` (expired, or within ``skew`` of it); None while it does."""
    if not isinstance(expires_at, int | float) or isinstance(expires_at, bool):
        return f"has no expiry time ({expires_at!r})"
    if now + skew < expires_at:
        return None
    margin = f", within the {skew:g} s allowed for clock skew" if now < expires_at else ""
    return f"expired at {_utc(float(expires_at))} (ledger clock {_utc(now)}{margin})"


def before_execution(session: RunSession, tool: Tool, call: Call, evidence: Evidence) -> Work[None]:
    """Nothing when ``call`` carries no approval or one still valid by the ledger's
    clock; else freeze it ``awaiting_approval`` again, nothing sent."""
    approval = call.approval
    if approval is None:
        return
    late = lapsed(
        approval.get("expires_at"), session.ledger_now(), session.act_settings.max_clock_skew
    )
    if late is None:
        return
    seen = yield from evidence(call, tool)
    _await_fresh(session, call.step, approval, late, {**seen, "tool": tool.name})


def check_receipt(
    session: RunSession, tool: Tool, call: Call, receipt: Receipt, evidence: Evidence
) -> Work[None]:
    """Nothing when the receipt of the approved act ``call`` proves its commit within
    the approval; else freeze for review with both as evidence."""
    approval = call.approval or {}
    expires, committed = approval.get("expires_at"), receipt.committed_at
    skew = session.act_settings.max_clock_skew
    clock = "the target's clock"
    if committed is None and not tool.shared:  # private: the commit is this act's own
        committed, clock = session.ledger_now(), "the ledger's clock, at its receipt"
    problem = None
    if tool.shared and receipt.approval_digest != approval.get("digest"):
        problem = (
            f"{tool.name} is shared and its receipt does not bind the approval "
            f"(receipt: {receipt.approval_digest}, approval: {approval.get('digest')})"
        )
    elif committed is None:
        problem = (
            f"{tool.name} is shared and its receipt carries no commit time, so nothing "
            "proves the effect committed before the approval expired"
        )
    elif lapsed(expires, committed, skew) is not None:
        margin = f" (or within the {skew:g} s allowed for clock skew)" if skew else ""
        problem = (
            f"the effect committed at {_utc(committed)} ({clock}), after the approval "
            f"expired at {_utc(float(expires or 0))}{margin}"
        )
    if problem is None:
        return
    seen = yield from evidence(call, tool)
    session.freeze(
        f"act {call.step!r}: {problem}; it is not taken as the approved effect and "
        "nothing else executes: review it",
        {
            **seen,
            "approval": approval,
            "receipt": {
                "receipt_id": receipt.receipt_id,
                "intent_digest": receipt.intent_digest,
                "result": receipt.result,
                "committed_at": receipt.committed_at,
                "approval_digest": receipt.approval_digest,
            },
        },
        key=call.step,
    )


def _awaiting(events: list[Event], key: str) -> Event | None:
    for event in reversed(events):
        if (
            event.type is EventType.RUN_FROZEN
            and event.key == key
            and payloads.run_frozen(event).get("status") == RunStatus.AWAITING_APPROVAL.value
        ):
            return event
    return None


def _await_fresh(
    session: RunSession, key: str, approval: dict[str, Any], why: str, evidence: dict[str, Any]
) -> NoReturn:
    """Freeze act ``key`` ``awaiting_approval`` again with the pending act of its first
    freeze (what a fresh approval binds), the lapsed approval and the act's evidence."""
    first = _awaiting(session.journal(), key)
    before = (payloads.run_frozen(first).get("evidence") or {}) if first is not None else {}
    if "pending_act" not in before:  # never asked for here: for a human
        session.freeze(
            f"act {key!r}: its approval {why}, and there is no pending act to approve "
            "again; nothing was executed",
            {**evidence, "approval": approval},
            key=key,
        )
    frozen = {
        **{k: v for k, v in before.items() if k != "refused_approvals"},
        "expired_approval": {**approval, "why": why},
        "act": evidence,
    }
    exc = ApprovalRequired(
        f"act {key!r}: the approval it consumed {why} before the act executed; nothing "
        "was executed, and nothing is until a fresh approval of the same act "
        f"(crashproof approve {shlex.quote(session.run_id)} {shlex.quote(key)})",
        frozen,
    )
    await_approval(session, key, exc, frozen)


def await_approval(
    session: RunSession, key: str, exc: ApprovalRequired, evidence: dict[str, Any]
) -> NoReturn:
    """Freeze the run ``awaiting_approval`` at act ``key`` with ``evidence`` (journaled,
    the drive halted) and raise ``exc``: an act a policy says needs approval, or one
    whose approval lapsed before it executed."""
    reason = str(exc)
    session.append_event(
        EventType.RUN_FROZEN,
        key,
        payloads.as_dict(
            payloads.RunFrozen(
                status=RunStatus.AWAITING_APPROVAL.value,
                reason=reason,
                evidence=evidence,
                retryable=False,
                error=error_record(exc),
            )
        ),
        status=(RunStatus.AWAITING_APPROVAL, reason),
    )
    session.halt(exc, evidence)
    raise exc
