"""No new key around an unknown outcome (#28 item 4; seed 003: "不得用新 key 绕过未知状态").

The store indexes every act whose intent is journaled and unresolved, across the runs of
the ledger (``store/intents.py``), and refuses a run's *new* act intent while another
run holds the same intent digest on the same instance (``IntentHeld``). Here the act
that met the refusal waits: nothing of it is journaled (the store kept nothing of the
refused append) and nothing was sent, so nothing is in doubt but the wait, and the run
stops retryable (``unavailable:<key>: waiting for another run: ...``, outage.py's
``journal_stop``), naming the holding runs and since when, the holders as evidence. A
worker resumes it with backoff (store/queue.py ``retryable_stop``); once the holder is
reconciled or resolved (its act ends, or the run does, or it stops with the tool's word
that no attempt of the act was done: steps/outage.py ``none_done``), that resume goes
on; while the holder waits for a person, every resume stops again, sending nothing. The
stop names no ``unavailable`` evidence: it releases no hold (it has none) and is no
record of the act's (journal/fold.py), so an act that waits after a ``none_done`` stop
still resumes as that stop says. Never checked: an act the run itself holds (its
retries, its reconciliation, a replan's new epoch), a replayed act (no append at all).
Checked again: the next attempt after such a stop, which held nothing since (acts.py),
so that it never races another run's act on the intent meanwhile.

The way past a holder that will not be resolved: an operator's explicit override,
``Ledger.resume(run_id, override_intent=[holder, ...], by=...)`` (CLI ``crashproof
resume RUN --override-intent HOLDER``). It journals an ``intent_override`` record (who,
host, the intent, the runs overridden and the holds the run waited on) at the waiting
act's key; the act's first intent then names those runs (``overrides``) and the store
lets it pass them, and only them. A run journaled by an earlier version froze
(``needs_review``, retryable) instead of stopping: the override reads that freeze too.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from crashproof._excerpt import shown
from crashproof.errors import CrashproofError, IntentHeld, RunStopped
from crashproof.journal import payloads
from crashproof.journal.fold import Replay
from crashproof.journal.records import Event, EventType
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.handoff import Settle, Work
from crashproof.runtime.steps.outage import journal_stop
from crashproof.store.queue import RETRYABLE_PREFIX
from crashproof.tools.port import Call

__all__ = ["NothingToOverride", "first_intent", "intent_override", "waits_for_holder"]

# What a wait's stop reason says after its key (``waits_for_holder`` finds it there).
_WAITS = "waiting for another run: "


class NothingToOverride(CrashproofError):
    """An override names no run the waiting act waits for; nothing was journaled."""


def waits_for_holder(reason: str | None) -> bool:
    """Whether a stop ``reason`` is an act's wait for another run's unresolved intent."""
    text = reason or ""
    return text.startswith(RETRYABLE_PREFIX) and f": {_WAITS}" in text


def first_intent(
    session: RunSession, call: Call, journal: Callable[[list[str] | None], None]
) -> Work[None]:
    """``journal(overrides)`` the first intent of a new act; when the store refuses it
    (another run holds the intent unresolved), again with the runs an operator overrode
    for this act, if that covers every holder; else stop, retryable, naming them."""
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
    _wait(session, call, held, passed)


def _wait(session: RunSession, call: Call, held: IntentHeld, passed: set[str]) -> NoReturn:
    """Stop the run at the act, retryable: it waits for the holders (journaled with them
    as evidence); ``RunStopped`` raised. Nothing of the act was journaled or sent."""
    run_id = session.run_id
    names = [str(h.get("run_id")) for h in held.holders]
    said = str(held).removeprefix(f"act {call.step!r} of run {run_id!r}: ")  # the key says
    reason = f"{RETRYABLE_PREFIX}{call.step}: {_WAITS}{shown(said)}"
    flags = " ".join(f"--override-intent {shlex.quote(n)}" for n in names)
    stopped = RunStopped(
        run_id,
        reason,
        detail=(
            f"nothing of act {call.step!r} was sent or journaled; a worker (crashproof "
            f"worker) resumes it with backoff and it goes on once {', '.join(names)} "
            "resolved the act; to let it pass (the effect may then happen twice): "
            f"crashproof resume {shlex.quote(run_id)} --app MODULE {flags} --by NAME"
        ),
    )
    evidence: dict[str, Any] = {
        "reason": reason,
        "next_step": call.step,  # the act attempted again on resume
        "next_kind": "act",
        "operation_id": call.operation_id,
        "intent_digest": call.intent_digest,
        "attempt": call.attempt,
        "params": call.params,
        "intent_held": {
            "intent_digest": call.intent_digest,
            "holders": held.holders,
            "overridden": sorted(passed),
        },
    }
    journal_stop(session, call.step, stopped, evidence)
    raise stopped from held


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
    ``run_id`` waits at pass ``holders``; NothingToOverride unless the run stopped (or,
    journaled by an earlier version, froze) on an intent other runs hold and each of
    ``holders`` is one of them."""
    outcome = replay.outcome
    held = None
    if outcome is not None and outcome.type in (EventType.RUN_STOPPED, EventType.RUN_FROZEN):
        evidence = payloads.frozen_or_stopped(outcome).get("evidence")
        held = evidence.get("intent_held") if isinstance(evidence, dict) else None
    if outcome is None or not isinstance(held, dict):
        raise NothingToOverride(
            f"run {run_id!r} is not waiting on an intent another run holds unresolved; "
            "nothing was changed. --override-intent only lets an act that waits so pass "
            "the runs it names (see `crashproof show RUN --timeline`)"
        )
    named = [str(h.get("run_id")) for h in held.get("holders") or () if isinstance(h, dict)]
    strangers = [r for r in holders if r not in named]
    if strangers or not holders:
        raise NothingToOverride(
            f"run {run_id!r} waits at act {outcome.key!r} on the intent held by "
            f"{', '.join(named) or 'nobody'}, not by {', '.join(strangers) or 'nobody'}; "
            "nothing was changed. Name the holding runs its stop names"
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
