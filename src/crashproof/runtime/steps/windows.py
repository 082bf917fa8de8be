"""Idempotency windows: a "not found" past the target's memory proves nothing.

A target that forgets operation ids after a while (Stripe prunes idempotency keys after
24 hours, AWS client tokens expire) answers "not found" both for an effect that never
happened and for one whose key it has forgotten. 003: re-submit only when the target
says the operation does not exist *and* the window is still open. Past it, the act
freezes for review with both times as evidence.

Times. The target's window starts at the key's first use, after the first intent of this
operation id was journaled; the intent's age is the ledger's clock now minus that
intent's time, and the two must come from one clock or allow for two:

- on a ledger whose clock is a server's (PostgreSQL), the intent records the server's
  time (``server_at``, for a tool with a window) and the age is the server's now minus
  it: one clock, whatever the hosts' clocks say;
- otherwise (SQLite, or an intent without ``server_at``) the intent's time is the
  ``created_at`` of the host that journaled it, and its age is counted
  ``ActSettings.window_margin`` seconds older than the ledger's clock says (the ledger's
  clock never runs behind the intents it holds: store/port.py ``Store.now``): a writer
  whose clock ran ahead by up to the margin cannot make a forgotten key look remembered.
  A reader whose clock is more than the margin behind the intent (negative age) cannot
  tell the age at all, and that freezes too.

A target's own clock (an HTTP ``Date``) is not used: it says the target's now, not the
target's time at the intent, so it cannot be subtracted from the intent's time either.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from crashproof.journal.records import Event, EventType
from crashproof.runtime.port import RunSession

__all__ = ["first_intent_at", "forgotten_key"]

IntentTime = tuple[float, float | None]  # (created_at, server_at or None)


def first_intent_at(open_events: list[Event], operation_id: str) -> IntentTime | None:
    """The times of the first intent for ``operation_id`` among ``open_events``: the
    journaling host's (``created_at``) and the ledger server's, when recorded."""
    for event in open_events:
        if event.type is EventType.ACT_INTENT:
            payload = event.payload or {}
            op = payload.get("operation_id")
            if op is None or op == operation_id:
                server = payload.get("server_at")
                return float(event.created_at), float(server) if server is not None else None
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
    window: timedelta | None, since: IntentTime | None, session: RunSession
) -> tuple[str, dict[str, Any]] | None:
    """None when a "not found" may be trusted (no window, or inside it); else the
    reason (its tail) and the evidence of a freeze."""
    if window is None or since is None:
        return None
    limit = window.total_seconds()
    now = session.ledger_now()
    created, server = since
    intent_at, margin = created, session.act_settings.window_margin
    one_clock = server is not None and session.server_clock
    if server is not None and one_clock:
        intent_at, margin = server, 0.0
    age = now - intent_at
    evidence = {
        "intent_at": intent_at,
        "lookup_at": now,
        "clock": "ledger server" if one_clock else "hosts (with margin)",
        "margin_seconds": margin,
        "window_seconds": limit,
        "intent_age_seconds": age,
    }
    if age < -margin:
        return (
            f"the intent was journaled {_span(-age)} after the ledger's clock's now (clock "
            f"skew beyond the {margin:g} s margin), so its age against the target's window "
            f"({_span(limit)}) cannot be told",
            evidence,
        )
    if age + margin <= limit:
        return None
    counted = f" (counting the {margin:g} s margin for clock skew)" if margin else ""
    return (
        f"the target may have forgotten the key: intent journaled {_span(age)} ago"
        f"{counted}, window {_span(limit)}",
        evidence,
    )
