"""Idempotency windows: a "not found" past the target's memory proves nothing.

A target that forgets operation ids after a while (Stripe prunes idempotency keys after
24 hours, AWS client tokens expire) answers "not found" both for an effect that never
happened and for one whose key it has forgotten. 003: re-submit only when the target
says the operation does not exist *and* the window is still open. Past it, the act
freezes for review with both times as evidence.

Times: the intent's age is the ledger's clock now minus the ``created_at`` the journal
recorded with the first intent of this operation id (the key's first use starts the
target's window). The journal's time was written by whichever process journaled the
intent, maybe on another host: a clock behind it by more than ``SKEW`` seconds (negative
age) means the age cannot be told, and that freezes too; a smaller skew counts as age 0.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from crashproof.journal.records import Event, EventType

__all__ = ["SKEW", "first_intent_at", "forgotten_key"]

SKEW = 5.0  # seconds a clock may run behind the journal's before the age is unknowable


def first_intent_at(open_events: list[Event], operation_id: str) -> float | None:
    """The journal's time of the first intent for ``operation_id`` among ``open_events``."""
    for event in open_events:
        if event.type is EventType.ACT_INTENT:
            op = (event.payload or {}).get("operation_id")
            if op is None or op == operation_id:
                return float(event.created_at)
    return None


def _span(seconds: float) -> str:
    if seconds >= 86400 * 2:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 3600 * 2:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.1f} s"


def forgotten_key(
    window: timedelta | None, intent_at: float | None, now: float
) -> tuple[str, dict[str, Any]] | None:
    """None when a "not found" may be trusted (no window, or inside it); else the
    reason (its tail) and the evidence of a freeze."""
    if window is None or intent_at is None:
        return None
    limit = window.total_seconds()
    age = now - intent_at
    evidence = {
        "intent_at": intent_at,
        "lookup_at": now,
        "window_seconds": limit,
        "intent_age_seconds": age,
    }
    if age < -SKEW:
        return (
            f"the intent was journaled {_span(-age)} after this clock's now (clock skew), "
            f"so its age against the target's window ({_span(limit)}) cannot be told",
            evidence,
        )
    if age <= limit:
        return None
    return (
        f"the target may have forgotten the key: intent journaled {_span(age)} ago, "
        f"window {_span(limit)}",
        evidence,
    )
