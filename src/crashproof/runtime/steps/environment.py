"""Environment observation: what an act saw of the world, and checking it again on resume.

Recording. Before an act's first intent commits, the runtime asks its tool to
``observe()`` the environment (``cp.Observation``: instance, fingerprint, version,
details) and to ``expect()`` the fingerprint the act will leave; both go into the intent
record (``payload["observed"] = {"before": ..., "expected": ...}``). With the receipt it
observes again and records the state the act left (``payload["observed"]`` of the
``step_done``). A tool without ``observe`` records nothing and is never checked.

Checking. On resume, the workflow replays from the top; recorded calls run nothing. The
first call that would run something live — a step, a decision, an act, the
reconciliation of an act in flight, an outbox delivery — first re-observes every
environment the run recorded, through the tool objects replay has handed to ``ctx.act``
so far (``WorldCheck.seen``) plus the tool of the act being reconciled. Per environment:

- the tool now observes another instance than the act recorded → changed;
- the fingerprint equals the last recorded one (the state the last completed act left,
  or the pending act's ``before``) → unchanged, go on;
- an act is pending on it and the fingerprint is its ``expected`` result → the act
  happened and its receipt was lost: reconcile as usual (lookup finds it);
- an act is pending and its tool cannot predict its result (``expect`` gave None) → the
  pending act's lookup decides, as it always did;
- anything else → changed.

Any change freezes the run in ``needs_review`` (``cp.EnvironmentChanged``) with both
observations per environment as evidence, before the live call: nothing executes, no
lookup runs. The freeze is retryable in the sense that every later resume observes
again: once someone restores the environment, the run goes on; until then each resume
freezes it again with fresh evidence, executing nothing. A tool whose ``observe`` raises
freezes the run the same way (a later resume observes again).

Limits (why at the first hand-over, not at claim time): tools are objects the workflow
passes to ``ctx.act``; the journal cannot rebuild them, so the runtime only knows a tool
once replay reaches a call that uses it. Deterministic replay reaches every recorded act
before the first live call, so every environment a completed or pending act recorded is
checked by then. Not covered: tools without ``observe``; changes made between the check and
the act (base hashes and compare-and-swap refs still guard those). A ``ctx.step`` that
writes into an observed environment is not an act, so its writes look like someone
else's on resume — the safe direction. A workspace observation leaves out caches and
what git ignores (``crashproof.tools._scope``); leave other such paths out with
``Workspace(root, observe_ignore=[...])``.
"""

from __future__ import annotations

import logging
from typing import Any

from crashproof._excerpt import shown
from crashproof.errors import EnvironmentChanged
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest, error_record
from crashproof.journal.fold import Replay
from crashproof.journal.records import EventType, StepKind
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.handoff import Invoke, Work
from crashproof.tools.port import Call, Observation, Tool

__all__ = ["WorldCheck", "environment_fingerprint", "observe_after", "observe_before", "observing"]

log = logging.getLogger(__name__)


def observing(tool: Tool) -> Work[Observation | None]:
    """What ``tool`` observes now, asked in a handoff; no handoff for a tool that keeps
    ``Tool.observe`` (it observes nothing: a thread hop and a commit point saved)."""
    if getattr(type(tool), "observe", None) is Tool.observe:
        return None
    observed: Observation | None = yield Invoke(tool.observe, (), f"observe of tool {tool.name!r}")
    return observed


def observe_before(tool: Tool, call: Call) -> Work[dict[str, Any] | None]:
    """What the intent records: the environment before the act, and its expected result.
    An observation that fails is logged and left out (that environment is then not
    checked on resume); it never blocks the act."""
    try:
        before = yield from observing(tool)
        if before is None:
            return None
        expected = tool.expect(call, before)
    except Exception as exc:
        log.warning("could not observe %s before act %r: %r", tool.name, call.step, exc)
        return None
    return {"before": before.to_json(), "expected": expected}


def environment_fingerprint(tool: Tool) -> Work[str | None]:
    """One digest of what ``tool`` observes now (instance and state), which an approval
    binds; None for a tool that does not observe. An observation that fails is a value
    too ("unobservable"), so an approval made while it worked does not match it."""
    try:
        seen = yield from observing(tool)
    except Exception as exc:
        log.warning("could not observe %s for an approval: %r", tool.name, exc)
        return "unobservable"
    if seen is None:
        return None
    state = seen.to_json()
    return canonical_digest(
        {"instance": state.get("instance"), "fingerprint": state.get("fingerprint")},
        what=f"the observation of {tool.name}",
    )


def observe_after(tool: Tool, step: str) -> Work[dict[str, Any]]:
    """What the receipt records (``{"observed": ...}``, or nothing): the environment as the
    act left it. Never raises: the receipt of an effect that happened must be journaled
    whatever the observation does."""
    try:
        after = yield from observing(tool)
    except Exception as exc:
        log.warning("could not observe %s after act %r: %r", tool.name, step, exc)
        return {}
    return {} if after is None else {"observed": after.to_json()}


class WorldCheck:
    """One per Context: the observations the journal holds, the tools replay has handed
    over, and the one-time check at the first live call."""

    def __init__(self, replay: Replay) -> None:
        # act key -> the observation recorded for it (its instance is what the tool at
        # that key must still observe).
        self.recorded: dict[str, dict[str, Any]] = {}
        # instance -> {"observation", "key", "tool", "pending", "expected"}: the latest.
        self.latest: dict[str, dict[str, Any]] = {}
        for event in replay.done:
            if not event.mentions("observed"):
                continue
            payload = payloads.step_done(event)
            observed = payload.get("observed")
            if observed and event.key is not None and payload.get("kind") == StepKind.ACT:
                self._note(event.key, observed, None, pending=False)
        for key, events in replay.open_acts.items():
            for event in events:
                is_intent = event.type is EventType.ACT_INTENT  # an act_unknown observes nothing
                observed = payloads.act_intent(event).get("observed") if is_intent else None
                if observed:
                    self._note(key, observed["before"], observed, pending=True)
                    break
        self.pending = bool(self.recorded)
        self._tools: dict[int, tuple[Tool, list[str]]] = {}

    def _note(
        self, key: str, obs: dict[str, Any], intent: dict[str, Any] | None, *, pending: bool
    ) -> None:
        self.recorded[key] = obs
        self.latest[str(obs["instance"])] = {
            "observation": obs,
            "key": key,
            "pending": pending,
            "expected": intent.get("expected") if intent else None,
        }

    def seen(self, key: str, tool: Tool) -> None:
        """Replay handed ``tool`` to the recorded act ``key``."""
        if key in self.recorded:
            entry = self._tools.setdefault(id(tool), (tool, []))
            entry[1].append(key)

    def check(
        self, session: RunSession, key: str | None = None, tool: Tool | None = None
    ) -> Work[None]:
        """Before the first live call of this drive (``key``/``tool``: the act about to
        run or be reconciled, if it is one). Freezes the run on any change."""
        if not self.pending:
            return
        self.pending = False
        if key is not None and tool is not None:
            self.seen(key, tool)
        changes: list[dict[str, Any]] = []
        unobservable: list[dict[str, Any]] = []
        checked: set[str] = set()
        for tool_obj, keys in self._tools.values():
            try:
                now = yield from observing(tool_obj)
            except Exception as exc:
                unobservable.append({"tool": tool_obj.name, "step": keys[0], **_err(exc)})
                continue
            for act_key in keys:
                change = self._compare(tool_obj, act_key, now, checked)
                if change is not None:
                    changes.append(change)
        if changes:
            names = ", ".join(f"{c['tool']} ({c['change']})" for c in changes)
            session.freeze(
                f"the environment drifted since the run last acted on it: {names}; "
                "nothing was executed. Compare the recorded and observed states; a resume "
                "observes again and goes on only once the environment is restored",
                {"environments": changes},
                key=changes[0]["step"],
                retryable=True,  # a resume re-observes: restored → goes on, else frozen again
                error=EnvironmentChanged,
            )
        if unobservable:
            session.freeze(
                "could not observe the environment before resuming ("
                + "; ".join(f"{u['tool']}: {shown(u['error']['message'])}" for u in unobservable)
                + "); nothing was executed, a later resume observes again",
                {"unobservable": unobservable},
                key=unobservable[0]["step"],
                retryable=True,
                error=EnvironmentChanged,
            )

    def _compare(
        self, tool: Tool, key: str, now: Observation | None, checked: set[str]
    ) -> dict[str, Any] | None:
        recorded = self.recorded[key]
        instance = str(recorded["instance"])
        latest = self.latest[instance]
        base = {"tool": tool.name, "step": key, "recorded": latest["observation"]}
        if now is None:
            return {**base, "change": "unobservable", "observed": None}
        if now.instance != instance:
            return {**base, "recorded": recorded, "change": "instance", "observed": now.to_json()}
        if instance in checked:
            return None
        checked.add(instance)
        fingerprint = now.fingerprint
        if fingerprint == latest["observation"]["fingerprint"]:
            return None
        if latest["pending"] and (latest["expected"] in (None, fingerprint)):
            return None  # the pending act happened (or only its lookup can tell)
        change = {**base, "step": latest["key"], "change": "state", "observed": now.to_json()}
        if latest["pending"]:
            change["expected"] = latest["expected"]
        return change


def _err(exc: BaseException) -> dict[str, Any]:
    return {"error": error_record(exc)}
