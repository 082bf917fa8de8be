"""No new key around an unknown outcome (#28 item 4; seed 003: "不得用新 key 绕过未知状态").

The store indexes every act whose intent is journaled and unresolved, across the runs of
the ledger (``store/intents.py``), and refuses a run's *new* act intent while another
run holds the same intent digest on the same instance (``IntentHeld``). Here the act
that met the refusal freezes, retryable: ``needs_review`` naming the holding run and
since when, nothing executed. Once that run is reconciled or resolved (its act ends, or
the run does, or it stops with the tool's word that no attempt of the act was done:
steps/outage.py ``none_done``), the next resume goes on. Never checked: an act the run
itself holds (its retries, its reconciliation, a replan's new epoch), a replayed act (no
append at all). Checked again: the next attempt after such a stop, which held nothing
since (acts.py), so that it never races another run's act on the intent meanwhile.

The way past a holder that will not be resolved: an operator's explicit override,
``Ledger.resume(run_id, override_intent=[holder, ...], by=...)`` (CLI ``crashproof
resume RUN --override-intent HOLDER``). It journals an ``intent_override`` record (who,
host, the intent, the runs overridden and the holds the run froze on) at the frozen
act's key; the act's first intent then names those runs (``overrides``) and the store
lets it pass them, and only them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from crashproof.errors import CrashproofError, IntentHeld
from crashproof.journal import payloads
from crashproof.journal.fold import Replay
from crashproof.journal.records import Event, EventType
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.handoff import Settle, Work
from crashproof.tools.port import Call

__all__ = ["NothingToOverride", "first_intent", "intent_override"]


class NothingToOverride(CrashproofError):
    """An override names no run the frozen act waits for; nothing was journaled."""


def first_intent(
    session: RunSession,
    call: Call,
    evidence: Callable[[], Work[dict[str, Any]]],
    journal: Callable[[list[str] | None], None],
) -> Work[None]:
    """``journal(overrides)`` the first intent of a new act; when the store refuses it
    (another run holds the intent unresolved), again with the runs an operator overrode
    for this act, if that covers every holder; else freeze, retryable, naming them,
    with ``evidence()`` (the act's, built only then: it observes the tool again)."""
    try:
        journal(None)
        yield Settle()  # committed by now (an async drive commits here): refused?
        return
    except IntentHeld as exc:
        held = exc
    passed = _overridden(session, call)
    if passed and {h["run_id"] for h in held.holders} <= passed:
        try:
            journal(sorted(passed))
            yield Settle()
            return
        except IntentHeld as exc:  # a holder appeared meanwhile
            held = exc
    seen = yield from evidence()
    session.freeze(
        f"{held}; nothing was executed",
        {
            **seen,
            "intent_held": {
                "intent_digest": call.intent_digest,
                "holders": held.holders,
                "overridden": sorted(passed),
            },
        },
        key=call.step,
        retryable=True,  # once the holder is resolved, a resume goes on
        error=IntentHeld,
    )


def _overridden(session: RunSession, call: Call) -> set[str]:
    """The runs an operator let this act pass (its intent_override records). Read only
    when the store refused an intent: never on a replay, never on an act with no holder."""
    passed: set[str] = set()
    for event in session.journal():
        if event.type is EventType.INTENT_OVERRIDE and event.key == call.step:
            override = payloads.intent_override(event)
            if override.get("intent_digest") == call.intent_digest:
                passed.update(str(r) for r in override.get("holders") or ())
    return passed


def intent_override(
    run_id: str, seq: int, replay: Replay, holders: Sequence[str], who: dict[str, Any]
) -> Event:
    """The ``intent_override`` record of an operator (``who``: by, host) letting the act
    ``run_id`` froze on pass ``holders``; NothingToOverride unless the run is frozen on
    an intent other runs hold and each of ``holders`` is one of them."""
    outcome = replay.outcome
    frozen = outcome is not None and outcome.type is EventType.RUN_FROZEN
    held = None
    if outcome is not None and frozen:
        evidence = payloads.run_frozen(outcome).get("evidence")
        held = evidence.get("intent_held") if isinstance(evidence, dict) else None
    if outcome is None or not isinstance(held, dict):
        raise NothingToOverride(
            f"run {run_id!r} is not frozen on an intent another run holds unresolved; "
            "nothing was changed. --override-intent only lets an act that froze so pass "
            "the runs it names (see `crashproof show RUN --timeline`)"
        )
    named = [str(h.get("run_id")) for h in held.get("holders") or () if isinstance(h, dict)]
    strangers = [r for r in holders if r not in named]
    if strangers or not holders:
        raise NothingToOverride(
            f"run {run_id!r} froze at act {outcome.key!r} on the intent held by "
            f"{', '.join(named) or 'nobody'}, not by {', '.join(strangers) or 'nobody'}; "
            "nothing was changed. Name the holding runs the freeze names"
        )
    return Event(
        run_id=run_id,
        seq=seq,
        type=EventType.INTENT_OVERRIDE,
        key=outcome.key,
        payload=payloads.as_dict(
            payloads.IntentOverride(
                by=str(who["by"]),
                host=str(who["host"]),
                intent_digest=str(held.get("intent_digest")),
                holders=sorted(set(holders)),
                held=[h for h in held.get("holders") or () if isinstance(h, dict)],
            )
        ),
        created_at=time.time(),
    )
