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
world, so earlier ones are reported confirmed and superseded rather than drifted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from crashproof.errors import DriftError, OutcomeUnknown
from crashproof.journal import payloads
from crashproof.journal.codec import error_record
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, EventType, StepStatus
from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["ActCheck", "reconcile_events"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ActCheck:
    run_id: str
    step: str
    operation_id: str
    tool: str
    status: str  # confirmed | drifted | needs_review
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "step": self.step,
            "operation_id": self.operation_id,
            "tool": self.tool,
            "status": self.status,
            "detail": self.detail,
        }


def reconcile_events(run_id: str, events: list[Event], tools: Iterable[Tool]) -> list[ActCheck]:
    """Check every succeeded act of one run's journal against its tool's lookup."""
    by_name = {tool.name: tool for tool in tools}
    replay = index_journal(events)
    intents: dict[str, Event] = {}
    acts: list[tuple[Event, Call | None, Tool | None]] = []
    for event in events:
        if event.type is EventType.ACT_INTENT and event.key is not None:
            intents[event.key] = event
        elif (
            event.type is EventType.STEP_DONE
            and payloads.step_done(event).get("kind") == "act"
            and payloads.step_done(event).get("status") == StepStatus.SUCCEEDED
        ):
            acts.append(_with_call(run_id, event, intents.get(str(event.key)), by_name))
    last_on_target: dict[tuple[str, str], str] = {}
    for event, call, tool in acts:
        target = tool.target_of(call) if tool is not None and call is not None else None
        if target is not None and tool is not None:
            last_on_target[(tool.name, target)] = str(event.key)
    checks = []
    for event, call, tool in acts:
        key = str(event.key)
        tool_name = _tool_name(event)
        status, detail = _check(event, call, tool, replay.undelivered, last_on_target)
        checks.append(
            ActCheck(
                run_id=run_id,
                step=key,
                operation_id=str(payloads.step_done(event).get("operation_id")),
                tool=tool_name,
                status=status,
                detail=detail,
            )
        )
    return checks


def _check(
    event: Event,
    call: Call | None,
    tool: Tool | None,
    undelivered: dict[str, Event],
    last_on_target: dict[tuple[str, str], str],
) -> tuple[str, str]:
    key = str(event.key)
    if "outbox" in payloads.step_done(event):
        if key in undelivered:
            return "needs_review", "outbox message committed but not delivered yet"
        return "confirmed", "outbox message delivered"
    if tool is None or call is None:
        return "needs_review", f"tool {_tool_name(event)!r} is not available here"
    target = tool.target_of(call)
    if target is not None and last_on_target.get((tool.name, target)) != key:
        later = last_on_target.get((tool.name, target))
        return "confirmed", f"superseded by {later!r} on {target}"
    if not tool.supports_lookup:
        return "needs_review", f"{tool.name} cannot look effects up"
    recorded = payloads.step_done(event).get("receipt") or {}
    try:
        found = tool.lookup(call)
    except DriftError as exc:
        return "drifted", str(exc)
    except OutcomeUnknown as exc:
        return "needs_review", f"lookup cannot tell: {exc}"
    except Exception as exc:
        return "needs_review", f"lookup failed: {error_record(exc)['message']}"
    return _compare(found, recorded, call)


def _compare(found: Receipt | None, recorded: dict[str, Any], call: Call) -> tuple[str, str]:
    if found is None:
        return "drifted", "the tool no longer holds this effect"
    if found.intent_digest is not None and found.intent_digest != call.intent_digest:
        return "drifted", (
            f"the tool holds intent {found.intent_digest}, the journal {call.intent_digest}"
        )
    if found.receipt_id != recorded.get("receipt_id"):
        return "drifted", (
            f"the tool's receipt is {found.receipt_id!r}, the journal's "
            f"{recorded.get('receipt_id')!r}"
        )
    return "confirmed", f"receipt {found.receipt_id!r}"


def _with_call(
    run_id: str, done: Event, intent: Event | None, tools: dict[str, Tool]
) -> tuple[Event, Call | None, Tool | None]:
    tool = tools.get(_tool_name(done))
    if intent is None:
        return done, None, tool
    recorded = intent.value or {}
    call = Call(
        run_id=run_id,
        step=str(done.key),
        operation_id=str(payloads.step_done(done).get("operation_id")),
        intent_digest=str(payloads.step_done(done).get("intent_digest")),
        params=recorded.get("params") or {},
        attempt=int(payloads.act_intent(intent).get("attempt", 1)),
        prepared=recorded.get("prepared"),
    )
    return done, call, tool


def _tool_name(event: Event) -> str:
    payload = payloads.step_done(event)
    if "outbox" in payload:
        return str(payload["outbox"].get("tool"))
    return str((payload.get("receipt") or {}).get("tool", "?"))
