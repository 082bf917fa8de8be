"""The audit timeline: who wrote each journal record, when, with which versions.

Records are attributed per *driving session*, not per record: each time a worker drives a
run (``Ledger.run`` of a new or existing run, ``Ledger.resume``), the first record that
drive writes carries ``payload["session"]`` — worker id (host:pid:nonce), crashproof
version, workflow name and version of the code driving it, the policy version it
enforces, its fencing token. The run's first record (``run_started``) names its starter
(``started_by``).

Why this is enough to attribute every record: a run is driven under a lease, and every
commit checks the lease's fencing token in the same transaction (DESIGN §7). So the
records from one session-carrying record up to the next were all written by that
session's worker. The exceptions carry their own attribution: operator decisions
(``budget_raised``, ``policy_rebound``: ``by``, ``host``, time) are written by the drive
that follows, under its lease, just before its first record; outbox deliveries made by
``Ledger.dispatch_outbox`` outside any drive are attributed to the last session (their
records name no worker); records written before this feature show the run's starter or
"unknown".

Cost: no extra record and no extra commit; one attribute test per append.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from crashproof._version import __version__
from crashproof.errors import RunNotFound
from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType
from crashproof.runtime.driving.leases import HOST
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.port import DriveHost

if TYPE_CHECKING:
    from crashproof.runtime.workflow import Workflow

__all__ = ["session_record", "run_timeline", "started_by", "timeline"]

# Records an operator appends (each carries its own by/host), not the driving worker.
_OPERATOR = (
    EventType.BUDGET_RAISED,
    EventType.POLICY_REBOUND,
    EventType.APPROVER_ADDED,
    EventType.APPROVAL_GRANTED,
    EventType.APPROVAL_REJECTED,
    EventType.REVIEW_DECIDED,
    EventType.RUN_MOVED,
    EventType.RUN_IMPORTED,
    EventType.INTENT_OVERRIDE,
    EventType.RUN_RETRIED,
    EventType.RUN_CANCELLED,
    EventType.RUN_FORKED,
    EventType.ACT_RECONCILED,
)


def started_by(worker_id: str) -> dict[str, Any]:
    """What ``run_started`` records about who started the run."""
    return {"worker": worker_id, "crashproof": __version__, "host": HOST, "pid": os.getpid()}


def session_record(
    worker_id: str, workflow: Workflow[Any], policy: Policy | None, lease: dict[str, Any]
) -> dict[str, Any]:
    """What the first record of a drive says of its session (the Context adds it to the
    first record it writes, so a drive that writes nothing, e.g. one answering a recorded
    outcome, leaves no trace), the lease it runs under included: ``lease`` is its receipt
    (``driving/leases.py`` ``Grant.receipt``: previous owner and token, new token, expiry
    and the decision that let this worker in)."""
    return {
        **started_by(worker_id),
        "workflow": workflow.name,
        "workflow_version": workflow.version,
        "policy_version": None if policy is None else policy.version,
        "fencing_token": lease["token"],
        "python": platform.python_version(),
        "lease": lease,
    }


def timeline(events: Sequence[Event]) -> list[dict[str, Any]]:
    """One entry per record, in journal order: seq, time, type, key, a one-line summary,
    and its attribution (session seq, worker, crashproof, workflow and policy versions,
    and the operator for operator decisions)."""
    if not events:
        return []
    started = payloads.run_started(events[0])
    starter = started.get("started_by") or {}
    policy = started.get("policy") or {}
    current: dict[str, Any] = {
        "session": None,
        "worker": starter.get("worker"),
        "crashproof": starter.get("crashproof"),
        "workflow_version": started.get("version"),
        "policy_version": policy.get("version"),
    }
    entries: list[dict[str, Any]] = []
    waiting: list[dict[str, Any]] = []  # operator records, attributed to the next session
    for event in events:
        entry: dict[str, Any] = {
            "seq": event.seq,
            "at": event.created_at,
            "type": event.type.value,
            "key": event.key,
            "summary": _summary(event),
        }
        p = payloads.drive_record(event).get("session")
        if isinstance(p, dict):
            current = {
                "session": event.seq,
                "worker": p.get("worker"),
                "crashproof": p.get("crashproof"),
                "workflow_version": p.get("workflow_version"),
                "policy_version": p.get("policy_version"),
            }
            for pending in waiting:
                pending.update(current)
            waiting = []
            lease = p.get("lease")
            if isinstance(lease, dict):  # the lease receipt of this drive (since 2026-12)
                entry["lease"] = lease
                was = lease.get("previous_owner") or "nobody"
                entry["summary"] = (
                    f"lease {lease.get('token')} ({lease.get('decision')}; before: {was}, "
                    f"token {lease.get('previous_token')}); {entry['summary']}"
                ).removesuffix("; ")
        elif event.type in _OPERATOR or (
            event.type in (EventType.RUN_THAWED, EventType.COMPATIBILITY_VERDICT)
            and event.mentions("by")  # by a human (a thaw, crashproof migrate --app)
        ):
            who = payloads.operator_record(event)
            entry["operator"] = {"by": who.get("by"), "host": who.get("host")}
            waiting.append(entry)
        elif waiting:  # no session followed the operator records: they stay with the last
            waiting = []
        entry.update(current)
        entries.append(entry)
    return entries


def _summary(event: Event) -> str:
    kind = event.type
    if kind is EventType.RUN_STARTED:
        started = payloads.run_started(event)
        return f"workflow {started.get('workflow')} v{started.get('version')} started"
    if kind is EventType.ACT_INTENT:
        i = payloads.act_intent(event)
        meaning = f", on unknown: {i['on_unknown']}" if "on_unknown" in i else ""
        return (
            f"intent: {i.get('tool')} v{i.get('tool_version')}, attempt {i.get('attempt')}"
            + meaning
        )
    if kind is EventType.STEP_DONE:
        p = payloads.step_done(event)
        status = p.get("status")
        receipt = p.get("receipt") or {}
        if receipt:
            return f"{p.get('kind')} {status}: receipt {receipt.get('receipt_id')}"
        if p.get("failure") == "not_done":  # an unknown outcome settled (steps/unknown.py)
            why = ", ".join(str(v) for v in (p.get("not_done") or {}).values())
            return f"{p.get('kind')} not done ({why})"
        if p.get("model"):
            return f"{p.get('kind')} {status} ({p.get('model')})"
        return f"{p.get('kind')} {status}"
    if kind is EventType.RUN_MOVED:
        m = payloads.run_moved(event)
        return f"operator {m.get('by')}@{m.get('host')}: exported, moved out of this ledger"
    if kind is EventType.RUN_IMPORTED:
        imported = payloads.run_imported(event)
        return (
            f"operator {imported.get('by')}@{imported.get('host')}: imported a "
            f"{imported.get('transfer')}, checkpoint {imported.get('checkpoint')}"
        )
    if kind is EventType.INTENT_OVERRIDE:
        o = payloads.intent_override(event)
        return (
            f"operator {o.get('by')}@{o.get('host')}: override, act goes on although "
            f"run(s) {', '.join(o.get('holders') or [])} hold its intent unresolved"
        )
    if kind is EventType.RUN_RETRIED:
        r = payloads.run_retried(event)
        again = f"call {r.get('retried')!r} attempted again" if r.get("retried") else "from the top"
        return f"operator {r.get('by')}@{r.get('host')}: retry of the failed run, {again}"
    if kind is EventType.RUN_FORKED:
        f = event.payload
        return (
            f"operator {f.get('by')}@{f.get('host')}: forked from run {f.get('from_run')!r} "
            f"at step {f.get('from_step')!r} (its sequence {f.get('from_seq')})"
        )
    if kind is EventType.RUN_CANCELLED:
        c = event.payload
        flight = c.get("in_flight") or []
        left = f"; left in flight for reconciliation: {', '.join(flight)}" if flight else ""
        why = f" ({c.get('reason')})" if c.get("reason") else ""
        return f"operator {c.get('by')}@{c.get('host')}: cancelled the run{why}{left}"
    if kind in _OPERATOR:
        who = payloads.operator_record(event)
        return f"operator {who.get('by')}@{who.get('host')}: {_change(who)}"
    if kind is EventType.COMPATIBILITY_VERDICT:
        return _verdict(payloads.compatibility_verdict(event))
    if kind in (EventType.RUN_FROZEN, EventType.RUN_STOPPED):
        halted = payloads.frozen_or_stopped(event)
        return f"{halted.get('status')}: {halted.get('reason')}"
    if kind is EventType.RUN_FAILED:
        error = payloads.run_failed(event).get("error") or {}
        return f"failed: {error.get('type')}: {error.get('message')}"
    recorded = payloads.any_record(event).get("error")  # attempts, unknown acts, outbox
    if isinstance(recorded, dict):
        return f"{recorded.get('type')}: {recorded.get('message')}"
    return ""


def _verdict(v: payloads.CompatibilityVerdict) -> str:
    """``compatibility verdict resumable: workflow 1 -> 2; replay compatible; 1 act mapped``."""
    changed = dict(v.get("changed") or {})
    tools = changed.pop("tools", None) or {}
    what = [f"{k} {_arrow(c)}" for k, c in changed.items()]
    what += [f"tool {n} {_arrow(c)}" for n, c in tools.items()]
    parts = [
        f"compatibility verdict {v.get('decision')}: " + (", ".join(what) or "no version change"),
        f"replay {(v.get('replay') or {}).get('status')}",
    ]
    if v.get("mapped"):
        parts.append(f"{len(v['mapped'])} act(s) mapped to a new tool contract")
    if v.get("value_maps"):
        parts.append(f"{len(v['value_maps'])} value map(s)")
    if v.get("unresolved"):
        parts.append(f"{len(v['unresolved'])} unresolved, first: {v['unresolved'][0]}")
    if v.get("by"):
        parts.append(f"applied by {v.get('by')}@{v.get('host')}")
    return "; ".join(parts)


def _arrow(change: Any) -> str:
    """``[old, new]`` as ``old -> new`` (anything else as it is: a reader never fails)."""
    if isinstance(change, list) and len(change) == 2:
        return f"{change[0]} -> {change[1]}"
    return str(change)


def _change(payload: payloads.OperatorRecord) -> str:
    old, new = payload.get("old"), payload.get("new")
    if isinstance(old, dict) and isinstance(new, dict) and "version" in new:
        return f"policy {old.get('version')} -> {new.get('version')}"
    if isinstance(new, dict):
        changed = {k: v for k, v in new.items() if not isinstance(old, dict) or old.get(k) != v}
        return "limits " + ", ".join(f"{k}={v}" for k, v in changed.items())
    return ""


def run_timeline(ledger: DriveHost, run_id: str) -> list[dict[str, Any]]:
    """The timeline of one run of ``ledger`` (its journal verified: MACs, chain, witness)."""
    if ledger.store.get_run(run_id) is None:
        raise RunNotFound(f"no run {run_id!r} in {ledger.shown_url}")
    return timeline(ledger.journal(run_id))
