"""The index of unresolved act intents, across the runs of one ledger (#28 item 4).

Within a run only a signed replan changes an operation id. Across runs the operation id
changes with the run id, so a new run whose act repeats an intent that another run left
in flight, unknown or frozen would execute it again under a new key ("不得用新 key 绕过
未知状态", seed 003). Every store therefore keeps, in the same transaction as the
journal append, one row per act of a run whose intent is journaled and unresolved:

- ``act_intent`` opens a hold (run, step key, intent digest, instance, since), unless
  the run already holds that step (a retry, a reconciliation, a replan's new epoch: the
  run's own act, never refused);
- an act's ``step_done`` (succeeded or failed) releases it; so does the run's end
  (``run_succeeded``, ``run_failed``), and the run's stop at the act after the tool
  said of each of its attempts that it was not done (``cp.Unavailable``: evidence
  ``unavailable.none_done``, runtime/steps/outage.py): nothing of it can have happened,
  so it holds nothing until its resume journals the next attempt, a new hold, checked
  like any other (a run that acted on the intent meanwhile, still unresolved, makes
  that resume wait in its turn). A move to another ledger (``run_moved``) does
  not: the act may still be unresolved where the run went, and this ledger cannot see
  there (the importing ledger indexes it again from the records it installs).

A new hold is refused (:class:`~crashproof.errors.IntentHeld`, nothing of the append
kept) while another run holds the same intent digest on the same instance, unless the
intent record names that run in ``overrides`` (an operator's journaled override).
The instance is the environment the tool observed before the act
(``Observation.instance``: a workspace root, a repository), when it observes one: the
same params on two workspaces are two intents. The index is a cache like the runs
index: rebuilt by the migration that added it from the journals, never trusted over
them; a deleted row lets one new intent through, it never blocks one.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from crashproof.errors import IntentHeld
from crashproof.journal.codec import decode
from crashproof.journal.records import Event, EventType

__all__ = ["Change", "IntentHold", "change_of", "held", "others", "raw_change", "touches"]

_INTENT = EventType.ACT_INTENT.value
_DONE = EventType.STEP_DONE.value
_STOPPED = EventType.RUN_STOPPED.value
_ENDS = frozenset((EventType.RUN_SUCCEEDED.value, EventType.RUN_FAILED.value))
_INDEXED = frozenset((_INTENT, _DONE, _STOPPED, *_ENDS))
_ACT_TEXT = '{"kind":"act",'  # how an act's step_done text begins (act_records.py)


@dataclass(frozen=True, slots=True)
class IntentHold:
    """One run's unresolved act: its step key, intent digest, the instance its tool
    observed ('' when none) and since when (its first unresolved intent record)."""

    run_id: str
    key: str
    intent_digest: str
    instance: str
    since: float

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "key": self.key,
            "intent_digest": self.intent_digest,
            "instance": self.instance,
            "since": self.since,
        }


@dataclass(frozen=True, slots=True)
class Change:
    """What one record does to the index: ``hold`` (key, digest, instance, since,
    overrides), ``release`` (key) or ``end`` (every hold of the run)."""

    what: str
    key: str = ""
    digest: str = ""
    instance: str = ""
    since: float = 0.0
    overrides: tuple[str, ...] = ()


_END = Change("end")


def touches(event: Event) -> bool:
    """Whether appending ``event`` changes the index (cheap: every append asks)."""
    type_ = event.type._value_
    if type_ not in _INDEXED:
        return False
    if type_ == _STOPPED:  # rare: a stop releases only when its act is not done
        return event.key is not None and _none_done(event.payload)
    if type_ != _DONE:
        return True
    text = event.payload_json
    return text.startswith(_ACT_TEXT) if text is not None else event.payload.get("kind") == "act"


def change_of(event: Event) -> Change | None:
    """The change ``event`` makes, or None."""
    if not touches(event):
        return None
    return _change(event.type._value_, event.key, event.payload, event.created_at)


def raw_change(type_: str, key: str | None, payload: str, created_at: float) -> Change | None:
    """The change a stored record (its type and payload text) makes, or None: for
    records installed as they are (a checkpoint import)."""
    if type_ not in _INDEXED or (type_ == _DONE and not payload.startswith(_ACT_TEXT)):
        return None
    if type_ == _STOPPED and '"none_done"' not in payload:  # the usual stop: skip the decode
        return None
    data = decode(payload)
    return _change(type_, key, data if isinstance(data, dict) else {}, created_at)


def _change(type_: str, key: str | None, payload: Mapping[str, Any], at: float) -> Change | None:
    if type_ in _ENDS:
        return _END
    if key is None:
        return None
    if type_ == _DONE:
        return Change("release", key)
    if type_ == _STOPPED:
        return Change("release", key) if _none_done(payload) else None
    observed = payload.get("observed")
    before = observed.get("before") if isinstance(observed, dict) else None
    instance = before.get("instance") if isinstance(before, dict) else None
    overrides = payload.get("overrides")
    return Change(
        "hold",
        key,
        # What holds match: the operation without the tool's version (hold_digest),
        # else (an intent journaled before it existed) the intent digest.
        str(
            payload.get("hold_digest")
            or payload.get("intent_digest")
            or payload.get("digest")
            or ""
        ),
        instance if isinstance(instance, str) else "",
        at,
        tuple(str(r) for r in overrides) if isinstance(overrides, list) else (),
    )


def _none_done(payload: Mapping[str, Any]) -> bool:
    """Whether a ``run_stopped`` payload says its act was not done in any attempt."""
    evidence = payload.get("evidence")
    seen = evidence.get("unavailable") if isinstance(evidence, dict) else None
    return (
        isinstance(seen, dict)
        and seen.get("kind") == "act"
        and seen.get("none_done") is True
        and isinstance(seen.get("operation_id"), str)
    )


def others(found: Iterable[IntentHold], run_id: str, change: Change) -> list[IntentHold] | None:
    """The holds of other runs that refuse ``change`` (a new hold of ``run_id``), from
    ``found``: the holds of the same digest and instance plus the run's own hold of the
    step, if any. None when the run holds the step already (its own act: never
    refused); else the other runs' holds its overrides do not name (empty: go on)."""
    rows = list(found)
    if any(h.run_id == run_id and h.key == change.key for h in rows):
        return None
    return [h for h in rows if h.run_id != run_id and h.run_id not in change.overrides]


def held(run_id: str, key: str, holders: list[IntentHold]) -> IntentHeld:
    """The refusal of run ``run_id``'s new intent at ``key``, naming who holds it."""
    first = holders[0]
    since = dt.datetime.fromtimestamp(first.since, tz=dt.UTC).isoformat(timespec="seconds")
    more = f" (and {len(holders) - 1} other run(s))" if len(holders) > 1 else ""
    mine, theirs = shlex.quote(run_id), shlex.quote(first.run_id)  # shell words to paste
    return IntentHeld(
        f"act {key!r} of run {run_id!r}: run {first.run_id!r}{more} holds the same intent "
        f"unresolved (act {first.key!r}, intent {first.intent_digest}) since {since}; "
        f"reconcile or resolve it first (crashproof resume {theirs}), or override "
        f"it explicitly (crashproof resume {mine} --override-intent {theirs})",
        holders=[{"run_id": h.run_id, "key": h.key, "since": h.since} for h in holders],
    )
