"""Reconciliation: compare every receipt a run recorded with what its tool says now.

The tool's receipt is the authority; the ledger's copy is a cache. ``reconcile`` asks
each tool to look up each recorded act and reports it as

- ``confirmed``: the tool holds the same effect (same receipt id, same intent);
- ``drifted``: the tool holds something else, or nothing any more (deleted, reverted,
  changed by someone else) — the journal is no longer the world;
- ``needs_review``: nobody can tell (no lookup, the lookup failed, the tool is not
  available here, an outbox message still pending).

State-addressed tools (the workspace) describe *what* an act changes through
``Tool.target_of(call)``; only the last act on each target can still be seen in the
world, so earlier ones are reported confirmed and superseded rather than drifted. An act
of another tool that overwrote the target is the last on it as well
(``Tool.overwrites``: a ``cp.Shell`` command whose recorded delta names a file a
workspace act wrote, or, in flight, whose snapshot holds it as that act wrote it).

Two callers: ``crashproof reconcile`` (``Ledger.reconcile``, read-only, every act of a
run against the tools given: per act, the tool of its name whose instance,
``Tool.observed_instance``, is the one the act observed; by name alone for a tool that
names none or an act that recorded none), and every resume (:func:`reread_receipts`):
once the journal's last act replayed (the body still holds its tools), else before its
first live call or its outcome, the completed acts whose tools replay handed over are
looked up again, a few at a time, and a drifted one freezes the run (``runtime/context.py``);
when every one that could not be re-read failed with ``cp.Unavailable`` (its tool out),
the run stops resumable instead, for a worker to resume (``outage.stop_reread``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from crashproof._excerpt import shown
from crashproof.errors import CrashproofError, DriftError, OutcomeUnknown, Unavailable
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest, error_record
from crashproof.journal.fold import Replay, index_journal
from crashproof.journal.records import Event, EventType, StepStatus
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.handoff import Invoke, InvokeAll, Outcome, Work, run_sync
from crashproof.runtime.steps.outage import stop_reread
from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["ACT_TEXT", "ActCheck", "ResumeReread", "reconcile_events", "reread_receipts"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActCheck:
    run_id: str
    step: str
    operation_id: str
    tool: str
    status: str  # confirmed | drifted | needs_review
    detail: str
    receipt: dict[str, Any] | None = None  # what the tool's lookup answered, if anything
    checked_at: float | None = None  # when the lookup answered (None: judged by the journal)
    # The lookup raised cp.Unavailable: the tool's target or machine is out, nothing told.
    unavailable: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "step": self.step,
            "operation_id": self.operation_id,
            "tool": self.tool,
            "status": self.status,
            "detail": self.detail,
            "receipt": self.receipt,
            "checked_at": self.checked_at,
        }


def reconcile_events(run_id: str, events: list[Event], tools: Iterable[Tool]) -> list[ActCheck]:
    """Check every succeeded act of one run's journal against its tool's lookup: the
    given tool of its name and recorded instance (:class:`_Given`)."""
    given = _Given(tools)
    acts = _acts(run_id, events, lambda done, instance: given.tool(_tool_name(done), instance))
    undelivered = index_journal(events).undelivered
    last_on_target = _last_on_target(
        run_id, events, acts, lambda _key, name, instance: given.tool(name, instance)
    )
    return run_sync(_checked(run_id, acts, undelivered, last_on_target, 1))


class _Given:
    """The tools an operator gave, found per act by name and instance.

    Several tools may share a name (every ``cp.Workspace`` is ``workspace``); an act
    recorded the instance its tool observed (``observed.instance`` of its receipt, else
    ``observed.before.instance`` of its intent: a first commit gives a repository its
    root), so it gets the given tool of that name whose ``Tool.observed_instance`` is
    that one. None of them is: only a tool that names no instance stands in (matched by
    name, as before instances were compared), else the act has no tool here. An act that
    recorded no instance (an older journal, a tool that does not observe) takes the last
    tool of its name, as it always did. A tool whose instance cannot be told now (a
    repository git cannot read) names none: its own lookup says what is wrong."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._by_name: dict[str, list[Tool]] = {}
        for tool in tools:
            self._by_name.setdefault(tool.name, []).append(tool)
        # Asked once per tool, and only when an act needs it (a git tool's is two git calls).
        self._instances: dict[int, str | None] = {}

    def tool(self, name: str, instance: str | None) -> Tool | None:
        """The tool for an act of tool ``name`` on ``instance`` (None: not recorded)."""
        found = self._by_name.get(name, [])
        if instance is not None:
            same = [tool for tool in found if self._instance(tool) == instance]
            if same:
                return same[-1]
            found = [tool for tool in found if self._instance(tool) is None]
        return found[-1] if found else None

    def _instance(self, tool: Tool) -> str | None:
        if id(tool) not in self._instances:
            self._instances[id(tool)] = _instance_of(tool)
        return self._instances[id(tool)]


def reread_receipts(
    run_id: str, events: list[Event], tools: Mapping[str, Tool], workers: int
) -> Work[list[ActCheck]]:
    """The completed acts of ``events`` whose tool (by act key: the objects replay handed
    to them) can look up and does not opt out (``Tool.reread_receipts``), looked up again,
    ``workers`` at a time; one check each, in journal order."""
    acts = _acts(run_id, events, lambda done, _instance: tools.get(str(done.key)))
    given = _Given(tools.values())

    def tool_of(key: str, name: str, instance: str | None) -> Tool | None:
        own = tools.get(key)  # an act in flight: its own, if seen
        return own if own is not None and own.name == name else given.tool(name, instance)

    last_on_target = _last_on_target(run_id, events, acts, tool_of)
    wanted = [
        act
        for act in acts
        if act[2] is not None
        and act[1] is not None
        and act[2].supports_lookup
        and act[2].reread_receipts
        and "outbox" not in payloads.step_done(act[0])
    ]
    return (yield from _checked(run_id, wanted, {}, last_on_target, workers))


# An act's step_done, its call (None: no intent in the journal), the tool that checks it
# (None: none here) and the instance its tool observed (None: not recorded).
_Act = tuple[Event, Call | None, Tool | None, str | None]
ACT_TEXT = '{"kind":"act",'  # how every act's step_done text begins (act_records.py)


class ResumeReread:
    """One per Context: the tools replay hands to completed acts, and the one-time
    re-read of their receipts once the last of them replayed (else before the drive's
    first live call, or its outcome)."""

    def __init__(self, replay: Replay) -> None:
        # Only a drive that replays a completed act has anything to re-read; the index
        # (in replay.done) of the last act's record: the re-read is due once it replays.
        acts = [i for i, e in enumerate(replay.done) if (e.payload_json or "").startswith(ACT_TEXT)]
        self.pending = bool(acts)
        self.last_act = acts[-1] if acts else -1
        self._tools: dict[str, Tool] = {}

    def seen(self, key: str, tool: Tool) -> None:
        """Replay handed ``tool`` to the recorded act ``key`` (or the drive's first live
        call is act ``key``, maybe in flight, with ``tool``)."""
        self._tools[key] = tool

    def check(
        self, session: RunSession, first: Callable[[], Work[None]] | None = None
    ) -> Work[None]:
        """Look the receipts up again; freeze on any that is gone or changed (for
        review), or that no lookup could answer (retryable: a later resume asks again),
        or stop resumable when all those lookups raised ``cp.Unavailable``.
        ``first``: run before such a freeze (the environment's check, whose freeze says
        more: a repository replaced, not only its receipts gone)."""
        if not self.pending:
            return
        self.pending = False
        if not self._tools:
            return
        workers = session.act_settings.reread_workers
        checks = yield from reread_receipts(session.run_id, session.journal(), self._tools, workers)
        if first is not None and any(c.status in ("drifted", "needs_review") for c in checks):
            yield from first()
        drifted = [c for c in checks if c.status == "drifted"]
        if drifted:
            session.freeze(
                f"{len(drifted)} completed act(s) no longer match their tool's receipt, "
                f"first {drifted[0].step!r} ({shown(drifted[0].detail)}); the journal's copy is "
                "not replayed as success and nothing was executed: review the receipts",
                {"receipts": [c.to_json() for c in drifted]},
                key=drifted[0].step,
                error=DriftError,
            )
        unknown = [c for c in checks if c.status == "needs_review"]
        if unknown and all(c.unavailable for c in unknown):  # a wait, not a question
            stop_reread(session, unknown[0].step, [c.to_json() for c in unknown])
        if unknown:
            session.freeze(
                f"the receipts of {len(unknown)} completed act(s) could not be re-read, "
                f"first {unknown[0].step!r} ({shown(unknown[0].detail)}); nothing was executed, "
                "a later resume reads them again",
                {"receipts": [c.to_json() for c in unknown]},
                key=unknown[0].step,
                retryable=True,
                error=DriftError,
            )


def _acts(
    run_id: str, events: list[Event], tool_of: Callable[[Event, str | None], Tool | None]
) -> list[_Act]:
    intents: dict[str, Event] = {}
    instances: dict[str, str] = {}  # act key -> the instance its last observing intent saw
    acts: list[_Act] = []
    for event in events:
        if event.type is EventType.ACT_INTENT and event.key is not None:
            intents[event.key] = event
            seen = _instance(payloads.act_intent(event).get("observed"), "before")
            if seen is not None:
                instances[event.key] = seen
        elif (
            event.type is EventType.STEP_DONE
            and payloads.step_done(event).get("kind") == "act"
            and payloads.step_done(event).get("status") == StepStatus.SUCCEEDED
        ):
            key = str(event.key)
            instance = _instance(payloads.step_done(event), "observed") or instances.get(key)
            intent = intents.get(key)
            acts.append(_with_call(run_id, event, intent, tool_of(event, instance), instance))
    return acts


def _instance_of(tool: Tool) -> str | None:
    try:
        return tool.observed_instance()
    except Exception as exc:
        log.warning("could not tell the instance of tool %s: %r", tool.name, exc)
        return None


def _instance(record: object, field: str) -> str | None:
    """``record[field]["instance"]`` when it is a string: an observation's instance."""
    observed = record.get(field) if isinstance(record, dict) else None
    instance = observed.get("instance") if isinstance(observed, dict) else None
    return instance if isinstance(instance, str) else None


def _last_on_target(
    run_id: str,
    events: list[Event],
    acts: list[_Act],
    tool_of: Callable[[str, str, str | None], Tool | None],
) -> dict[tuple[str, str], str]:
    """The last act on each target, completed or still in flight: an act in flight may
    have applied already (a crash after its write), so it supersedes the earlier ones.
    An act of another tool that overwrote a target (``Tool.overwrites``: a command that
    rewrote a file a workspace act wrote) is the last on it too."""
    last: dict[tuple[str, str], str] = {}
    owners: dict[tuple[str, str], tuple[Tool, Call]] = {}  # its last act's, for overwrites

    def record(key: str, tool: Tool, call: Call, result: Any) -> None:
        target = tool.target_of(call)
        if target is not None:
            last[(tool.name, target)] = key
            owners[(tool.name, target)] = (tool, call)
        if type(tool).overwrites is not Tool.overwrites:
            for target_key, (owner, earlier) in owners.items():
                if owner is tool:
                    continue
                try:
                    wrote = tool.overwrites(call, result, owner, earlier)
                except Exception as exc:  # the tool's own record is out of reach
                    last[target_key] = _Doubt(key, f"{type(exc).__name__}: {exc}")
                    continue
                if wrote:
                    last[target_key] = key

    for event, call, tool, _ in acts:
        if tool is not None and call is not None:
            record(str(event.key), tool, call, event.value)
    for key, intent in _open_intents(events).items():
        p = payloads.act_intent(intent)
        tool = tool_of(key, str(p.get("tool")), _instance(p.get("observed"), "before"))
        if tool is None:
            continue
        record(
            key,
            tool,
            _call(run_id, key, intent, p.get("operation_id"), p.get("intent_digest")),
            None,
        )
    return last


class _Doubt(str):
    """The key of an act whose ``Tool.overwrites`` raised for a target (its store could
    not be read): whether it superseded the target's last act cannot be told, so that
    act's check is ``needs_review`` (a resume freezes, retryable), neither confirmed as
    superseded nor judged by a lookup that may call the command's change a drift."""

    why: str

    def __new__(cls, key: str, why: str) -> _Doubt:
        made = super().__new__(cls, key)
        made.why = why
        return made


def _open_intents(events: list[Event]) -> dict[str, Event]:
    """The last intent of every act that has no final record (in flight, or unknown)."""
    finished = {
        str(e.key)
        for e in events
        if e.type is EventType.STEP_DONE and payloads.step_done(e).get("kind") == "act"
    }
    return {
        str(e.key): e
        for e in events
        if e.type is EventType.ACT_INTENT and str(e.key) not in finished
    }


def _checked(
    run_id: str,
    acts: list[_Act],
    undelivered: dict[str, Event],
    last_on_target: dict[tuple[str, str], str],
    workers: int,
) -> Work[list[ActCheck]]:
    """One check per act: judged from the journal where it can be, else by its tool's
    lookup (all of them in one handoff, ``workers`` at a time)."""
    verdicts = [_without_lookup(act, undelivered, last_on_target) for act in acts]
    lookups = [
        Invoke(tool.lookup, (call,), f"lookup of tool {tool.name!r}")
        for (_, call, tool, _), verdict in zip(acts, verdicts, strict=True)
        if verdict is None and tool is not None and call is not None
    ]
    found: Iterator[Outcome] = iter((yield InvokeAll(lookups, workers)) if lookups else ())
    checks = []
    answered_at = time.time()
    for (event, call, tool, _), verdict in zip(acts, verdicts, strict=True):
        receipt: dict[str, Any] | None = None
        looked_up = verdict is None and call is not None
        out = False
        if looked_up and call is not None:
            outcome = next(found)
            verdict = _judged(outcome, event, call, tool)
            out = isinstance(outcome.error, Unavailable)
            if isinstance(outcome.value, Receipt):
                receipt = _receipt_json(outcome.value)
        status, detail = verdict or ("needs_review", "not checked")
        checks.append(
            ActCheck(
                run_id=run_id,
                step=str(event.key),
                operation_id=str(payloads.step_done(event).get("operation_id")),
                tool=_tool_name(event),
                status=status,
                detail=detail,
                receipt=receipt,
                checked_at=answered_at if looked_up else None,
                unavailable=out,
            )
        )
    return checks


def _receipt_json(found: Receipt) -> dict[str, Any]:
    return {
        "receipt_id": found.receipt_id,
        "intent_digest": found.intent_digest,
        "result_digest": _canonical(found.result),
        "committed_at": found.committed_at,
    }


def _without_lookup(
    act: _Act, undelivered: dict[str, Event], last_on_target: dict[tuple[str, str], str]
) -> tuple[str, str] | None:
    """The check's outcome when the journal decides it alone; None: ask the tool."""
    event, call, tool, instance = act
    key = str(event.key)
    if "outbox" in payloads.step_done(event):
        if key in undelivered:
            return "needs_review", "outbox message committed but not delivered yet"
        return "confirmed", "outbox message delivered"
    if tool is None or call is None:
        on = f" (the act ran on {instance})" if instance is not None else ""
        return "needs_review", f"tool {_tool_name(event)!r} is not available here{on}"
    target = tool.target_of(call)
    later = last_on_target.get((tool.name, target)) if target is not None else None
    if isinstance(later, _Doubt):
        why = f"whether {str(later)!r} changed {target} cannot be told: {later.why}"
        return "needs_review", why
    if target is not None and later != key:
        return "confirmed", f"superseded by {later!r} on {target}"
    if not tool.supports_lookup:
        return "needs_review", f"{tool.name} cannot look effects up"
    return None


def _judged(found: Outcome, event: Event, call: Call, tool: Tool | None) -> tuple[str, str]:
    exc = found.error
    if isinstance(exc, DriftError):
        return "drifted", str(exc)
    if isinstance(exc, OutcomeUnknown):
        return "needs_review", f"lookup cannot tell: {exc}"
    if exc is not None:
        return "needs_review", f"lookup failed: {error_record(exc)['message']}"
    recorded = payloads.step_done(event).get("receipt") or {}
    if tool is not None and recorded.get("tool") not in (None, tool.name):
        return "drifted", (
            f"the receipt was made by tool {recorded.get('tool')!r}, the lookup asked "
            f"{tool.name!r}: another namespace"
        )
    return _compare(found.value, recorded, call, event.value)


def _compare(
    found: Receipt | None, recorded: dict[str, Any], call: Call, result: Any
) -> tuple[str, str]:
    """The receipt's whole identity: the effect is there, in the namespace of the tool
    that made it, under this intent (present and equal when the journal's receipt
    carried it), with the receipt id and the result the journal holds."""
    if found is None:
        return "drifted", "the tool no longer holds this effect"
    if found.intent_digest is not None and found.intent_digest != call.intent_digest:
        return "drifted", (
            f"the tool holds intent {found.intent_digest}, the journal {call.intent_digest}"
        )
    if found.intent_digest is None and recorded.get("intent_bound"):
        return "drifted", (
            f"the tool's receipt {found.receipt_id!r} no longer shows the intent digest "
            f"the journal's receipt carried ({call.intent_digest}): not this act's effect"
        )
    if found.receipt_id != recorded.get("receipt_id"):
        return "drifted", (
            f"the tool's receipt is {found.receipt_id!r}, the journal's "
            f"{recorded.get('receipt_id')!r}"
        )
    # The results as values (RFC 8785 digests): a target may send its keys in any order.
    now, then = _canonical(found.result), _canonical(result)
    if now is None or now != then:
        return "drifted", (
            f"the tool's receipt {found.receipt_id!r} holds another result than the journal "
            f"(canonical digest {now}, the journal's {then})"
        )
    return "confirmed", f"receipt {found.receipt_id!r}"


def _canonical(value: Any) -> str | None:
    try:
        return canonical_digest(value, what="a receipt's result")
    except CrashproofError:
        return None


def _with_call(
    run_id: str, done: Event, intent: Event | None, tool: Tool | None, instance: str | None
) -> _Act:
    if intent is None:
        return done, None, tool, instance
    p = payloads.step_done(done)  # the receipt names the operation that completed
    return (
        done,
        _call(run_id, str(done.key), intent, p.get("operation_id"), p.get("intent_digest")),
        tool,
        instance,
    )


def _call(run_id: str, key: str, intent: Event, operation_id: object, digest: object) -> Call:
    """The call an act's intent record describes, for ``operation_id`` and ``digest``."""
    recorded = intent.value or {}
    return Call(
        run_id=run_id,
        step=key,
        operation_id=str(operation_id),
        intent_digest=str(digest),
        params=recorded.get("params") or {},
        attempt=int(payloads.act_intent(intent).get("attempt", 1)),
        prepared=recorded.get("prepared"),
    )


def _tool_name(event: Event) -> str:
    payload = payloads.step_done(event)
    if "outbox" in payload:
        return str(payload["outbox"].get("tool"))
    return str((payload.get("receipt") or {}).get("tool", "?"))
