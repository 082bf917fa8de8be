"""Fold a run's journal into what readers and the replayer need. Pure functions."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from crashproof._excerpt import shown
from crashproof.errors import IntegrityError
from crashproof.journal import payloads
from crashproof.journal.records import (
    Budget,
    Event,
    EventType,
    Limits,
    RunInfo,
    RunRow,
    RunStatus,
    StepInfo,
    StepKind,
    StepStatus,
)

__all__ = [
    "Replay",
    "fold_run",
    "fold_steps",
    "index_journal",
    "cancelled_reason",
    "failed_reason",
    "moved_reason",
    "spend",
    "step_keys",
    "step_times",
    "tokens_of",
]

_TERMINAL = (
    EventType.RUN_SUCCEEDED,
    EventType.RUN_FAILED,
    EventType.RUN_FROZEN,
    EventType.RUN_STOPPED,
    EventType.RUN_CANCELLED,
)
_BUDGETED = (StepKind.STEP, StepKind.DECIDE, StepKind.ACT, StepKind.CHECK)
_OPEN_STATUS = {
    EventType.ATTEMPT_FAILED: StepStatus.RUNNING,
    EventType.ACT_INTENT: StepStatus.RUNNING,
    EventType.ACT_UNKNOWN: StepStatus.UNKNOWN,
}
_STEP_EVENTS = (EventType.STEP_DONE, *_OPEN_STATUS)
_STEP_DONE = EventType.STEP_DONE
# What a step's entry takes from its records when set (Literal: mypy checks each name is
# a key of the record read).
_OPEN_FIELDS: tuple[Literal["operation_id", "intent_digest"], ...] = (
    "operation_id",
    "intent_digest",
)
_DONE_FIELDS: tuple[
    Literal["model", "usage", "cost", "operation_id", "intent_digest", "failure"], ...
] = ("model", "usage", "cost", "operation_id", "intent_digest", "failure")


@dataclass(slots=True)
class Replay:
    """What the replayer needs from a journal, indexed once per resume."""

    started: Event
    done: list[Event]  # STEP_DONE events in journal order: the replay sequence
    # Failed attempts of a call with no STEP_DONE yet, since the latest stop of the run
    # at that call (a service out) or retry of it: a resume counts its attempts afresh.
    failed_attempts: dict[str, list[Event]] = field(default_factory=dict)
    # Acts in flight: intent/unknown events of keys with no STEP_DONE yet, and the stop
    # of a service out at such a key (runtime/steps/outage.py: its attempt was not done).
    open_acts: dict[str, list[Event]] = field(default_factory=dict)
    # Outbox acts committed but not yet delivered, in journal order.
    undelivered: dict[str, Event] = field(default_factory=dict)
    outcome: Event | None = None  # the latest RUN_SUCCEEDED / _FAILED / _FROZEN / _STOPPED
    next_seq: int = 0
    # The run's limits and policy binding as they stand now (run_started, then the
    # latest budget_raised / policy_rebound); None when the run never had any.
    limits: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    moved: Event | None = None  # a run_moved no run_imported followed: exported as a move


def index_journal(events: Sequence[Event]) -> Replay:
    """Check the journal's shape and index it for replay."""
    if not events or events[0].type is not EventType.RUN_STARTED:
        run = events[0].run_id if events else "?"
        raise IntegrityError(f"run {run!r}: journal does not begin with run_started")
    replay = Replay(started=events[0], done=[])
    replay.limits = payloads.run_started(events[0]).get("limits")
    replay.policy = payloads.run_started(events[0]).get("policy")
    done, open_acts = replay.done, replay.open_acts
    mapped: list[dict[str, Any]] = []  # acts mapped to a new tool contract (a verdict)
    for expected, event in enumerate(events):
        if event.seq != expected:
            raise IntegrityError(
                f"run {event.run_id!r}: journal has a gap or reorder at sequence {expected}"
            )
        kind = event.type
        if kind is _STEP_DONE:  # most of a journal: kept lean (every resume runs this)
            done.append(event)
            key = event.key
            if key is not None:
                if open_acts:
                    open_acts.pop(key, None)
                text = event.payload_json  # a stored payload without "outbox" in its text
                if (text is None or '"outbox"' in text) and event.mentions("outbox"):
                    replay.undelivered[key] = event
        elif kind is EventType.OUTBOX_DELIVERED and event.key is not None:
            replay.undelivered.pop(event.key, None)
        elif kind is EventType.ATTEMPT_FAILED and event.key is not None:
            replay.failed_attempts.setdefault(event.key, []).append(event)
        elif kind in (EventType.ACT_INTENT, EventType.ACT_UNKNOWN) and event.key is not None:
            replay.open_acts.setdefault(event.key, []).append(event)
        elif kind in _TERMINAL:
            replay.outcome = event
            if kind is EventType.RUN_STOPPED and event.key is not None and _outage(event):
                replay.failed_attempts.pop(event.key, None)  # counted afresh
                if event.key in open_acts:
                    open_acts[event.key].append(event)
        elif kind is EventType.RUN_THAWED:
            replay.outcome = None
        elif kind is EventType.RUN_RETRIED:
            replay.outcome = None
            _retried(replay, event)
        elif kind is EventType.BUDGET_RAISED:
            replay.limits = payloads.budget_raised(event)["new"]
        elif kind is EventType.POLICY_REBOUND:
            replay.policy = payloads.policy_rebound(event)["new"]
        elif kind is EventType.RUN_MOVED:
            replay.moved = event
        elif kind is EventType.RUN_IMPORTED:
            replay.moved = None
        elif kind is EventType.COMPATIBILITY_VERDICT:
            verdict = payloads.compatibility_verdict(event)
            if verdict.get("decision") == "resumable":
                mapped.extend(verdict.get("mapped") or [])
    replay.next_seq = len(events)
    if mapped:
        replay.done = _mapped(done, mapped)
    return replay


def _outage(event: Event) -> bool:
    """A run_stopped record of a service out (runtime/steps/outage.py), not a budget."""
    return "unavailable" in (payloads.run_stopped(event).get("evidence") or {})


def _retried(replay: Replay, event: Event) -> None:
    """A failed run re-driven: the failed call the record names replays no more (it is
    attempted again), its earlier attempts counted afresh."""
    retried = payloads.run_retried(event)
    seq, key = retried.get("failed_seq"), retried.get("retried")
    if seq is None:
        return
    done = replay.done
    if not done or done[-1].seq != seq or done[-1].key != key:
        raise IntegrityError(
            f"run {event.run_id!r}: run_retried at sequence {event.seq} names call "
            f"{key!r} (sequence {seq}), which is not the run's last recorded call"
        )
    done.pop()
    if key is not None:
        replay.failed_attempts.pop(key, None)


def _mapped(done: list[Event], mapped: list[dict[str, Any]]) -> list[Event]:
    """The replay sequence with each act a resumable verdict mapped to a new tool contract
    expecting the mapped intent digest (the code now makes it); its receipt, and the
    ``intent_digest`` the target holds, stay as recorded."""
    to = {(m.get("key"), m.get("from_digest")): m.get("to_digest") for m in mapped}
    out = []
    for event in done:
        new = to.get((event.key, payloads.step_done(event).get("digest"))) if event.key else None
        if isinstance(new, str):
            payload = {**event.payload, "digest": new}
            event = Event(
                event.run_id,
                event.seq,
                event.type,
                event.key,
                payload,
                event.created_at,
                event.value_json,
            )
        out.append(event)
    return out


def step_times(event: Event) -> tuple[float | None, float | None]:
    """When a recorded step started and ended: ``started_at``/``ended_at`` in its
    payload (acts, failures, and successful steps of older journals), or its duration
    ``took_us`` ending at the record's own ``created_at`` (successful steps now)."""
    p = payloads.step_record(event)
    took = p.get("took_us")
    if isinstance(took, int) and not isinstance(took, bool) and "started_at" not in p:
        return event.created_at - took / 1e6, event.created_at
    return p.get("started_at"), p.get("ended_at")


def tokens_of(usage: dict[str, Any] | None) -> int:
    """Tokens a decision consumed: ``total_tokens`` if given, else the sum of its counts."""
    if not isinstance(usage, dict) or not usage:  # journals are never unreadable over it
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool):
        return total
    return sum(v for v in usage.values() if isinstance(v, int) and not isinstance(v, bool))


def _cost_of(payload: payloads.StepDone) -> float:
    cost = payload.get("cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        return float(cost)
    return 0.0


def spend(budget: Budget, payload: payloads.StepDone) -> Budget:
    """``budget`` plus what one recorded step (a STEP_DONE payload) consumed."""
    kind = payload.get("kind")
    if kind not in _BUDGETED:
        return budget
    if kind != StepKind.DECIDE:
        return Budget(
            steps=budget.steps + 1,
            decisions=budget.decisions,
            tokens=budget.tokens,
            cost=budget.cost,
        )
    return Budget(
        steps=budget.steps + 1,
        decisions=budget.decisions + 1,
        tokens=budget.tokens + tokens_of(payload.get("usage")),
        cost=budget.cost + _cost_of(payload),
    )


_HALTS = (EventType.RUN_FROZEN, EventType.RUN_STOPPED)


def _failed_lookups(event: Event) -> int:
    """Lookups that could not tell (failed, timed out, or answered "cannot tell") behind
    a freeze or stop: the act protocol keeps them in its evidence (runtime/steps/acts.py)."""
    evidence = payloads.frozen_or_stopped(event).get("evidence")
    if not isinstance(evidence, dict):
        return 0
    errors = evidence.get("lookup_errors")
    return (len(errors) if isinstance(errors, list) else 0) + ("lookup_error" in evidence)


def count_unknowns(events: Sequence[Event]) -> int:
    """Outcomes nobody could tell: ``act_unknown`` records, and the failed or timed-out
    lookups a freeze or stop names in its evidence."""
    unknowns = 0
    for event in events:
        if event.type is EventType.ACT_UNKNOWN:
            unknowns += 1
        elif event.type in _HALTS:
            unknowns += _failed_lookups(event)
    return unknowns


def reconciled_findings(events: Sequence[Event]) -> dict[str, dict[str, Any]]:
    """The latest ``act_reconciled`` finding per act key (a later pass supersedes)."""
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.type is EventType.ACT_RECONCILED and event.key is not None:
            found[event.key] = event.payload
    return found


def step_keys(events: Sequence[Event]) -> list[str]:
    """The keys of a journal's steps in the order ``fold_run`` lists them (first record
    first), without decoding a payload: a page of steps is a slice of these."""
    seen: dict[str, None] = {}
    for event in events:
        if event.key is not None and event.type in _STEP_EVENTS:
            seen.setdefault(event.key)
    return list(seen)


def fold_steps(
    events: Sequence[Event], replay: Replay, wanted: Collection[str] | None = None
) -> tuple[StepInfo, ...]:
    """The steps of a journal (``replay``: its ``index_journal``), in ``step_keys``
    order; with ``wanted``, only those keys (each step folds from its own records only,
    so a page of steps equals that slice of all of them)."""
    steps: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.key is None or event.type not in _STEP_EVENTS:
            continue
        if wanted is not None and event.key not in wanted:
            continue
        p = payloads.step_record(event)
        info = steps.setdefault(
            event.key,
            {"key": event.key, "kind": StepKind(p["kind"]), "attempts": 0, "started_at": None},
        )
        info["attempts"] = max(info["attempts"], int(p.get("attempt", 1)))
        began, ended = step_times(event)
        if info["started_at"] is None:
            info["started_at"] = began
        info["ended_at"] = ended
        info["error"] = p.get("error")
        if event.type is not EventType.STEP_DONE:
            info["status"] = _OPEN_STATUS[event.type]
            for name in _OPEN_FIELDS:
                if p.get(name) is not None:
                    info[name] = p[name]
            continue
        done = payloads.step_done(event)
        info["status"] = StepStatus(done["status"])
        for fieldname in _DONE_FIELDS:
            if done.get(fieldname) is not None:
                info[fieldname] = done[fieldname]
        if "outbox" in done:
            info["delivery"] = "delivered" if event.key not in replay.undelivered else "pending"
    return tuple(StepInfo(**info) for info in steps.values())


def _spent(done: Sequence[Event]) -> Budget:
    """What the steps that replay consumed: ``spend`` over ``done``, summed in place (a
    20,000-step journal: one Budget, not 20,000)."""
    steps = decisions = tokens = 0
    cost = 0.0
    for event in done:  # what replays (a retried call's failure no more)
        payload = payloads.step_done(event)
        kind = payload.get("kind")
        if kind not in _BUDGETED:
            continue
        steps += 1
        if kind == StepKind.DECIDE:
            decisions += 1
            tokens += tokens_of(payload.get("usage"))
            cost += _cost_of(payload)
    return Budget(steps=steps, decisions=decisions, tokens=tokens, cost=cost)


def fold_run(
    row: RunRow, events: Sequence[Event], *, steps: bool = True, replay: Replay | None = None
) -> RunInfo:
    """The reader's view of a run, folded from its (verified) journal. The index row only
    supplies timestamps: its status, reason and identity are a cache, never trusted over
    the events. ``steps=False``: without its steps (``RunInfo.steps`` empty; a page of
    them is ``fold_steps``), everything else the same. ``replay``: the journal's
    ``index_journal``, when the caller has it already."""
    replay = index_journal(events) if replay is None else replay
    budget = _spent(replay.done)
    outcome = replay.outcome
    result = error = evidence = reason = None
    status = RunStatus.RUNNING
    if outcome is not None:
        if outcome.type is EventType.RUN_SUCCEEDED:
            status, result = RunStatus.SUCCEEDED, outcome.value
            if outcome.mentions("completion"):  # the checks it required, and what they saw
                evidence = {"completion": payloads.run_succeeded(outcome).get("completion")}
        elif outcome.type is EventType.RUN_FAILED:
            status, error = RunStatus.FAILED, payloads.run_failed(outcome).get("error")
            if isinstance(error, dict):
                reason = failed_reason(error)
        elif outcome.type is EventType.RUN_CANCELLED:  # runtime/operations/cancelling.py
            status, reason = RunStatus.CANCELLED, cancelled_reason(outcome.payload)
            evidence = {"cancelled": outcome.payload}
        else:  # frozen or stopped: the record names its status and reason
            halted = payloads.frozen_or_stopped(outcome)
            status = RunStatus(halted.get("status", RunStatus.NEEDS_REVIEW.value))
            reason = halted.get("reason")
            evidence = halted.get("evidence")
    if replay.moved is not None:  # its continuation lives where the checkpoint went
        status, reason = RunStatus.MOVED, moved_reason(replay.moved)
    started = payloads.run_started(replay.started)
    return RunInfo(
        run_id=row.run_id,
        workflow=str(started.get("workflow", row.workflow)),
        version=str(started.get("version", row.version)),
        status=status,
        reason=reason,
        input=replay.started.value or {},
        input_digest=str(started.get("input_digest", row.input_digest)),
        created_at=row.created_at,
        updated_at=row.updated_at,
        result=result,
        error=error,
        evidence=evidence,
        budget=budget,
        unknowns=count_unknowns(events),
        reconciled=reconciled_findings(events),
        steps=fold_steps(events, replay) if steps else (),
        limits=None if replay.limits is None else Limits.from_json(replay.limits),
        policy=replay.policy,
        humans=_humans(events),
    )


def failed_reason(error: dict[str, Any]) -> str:
    """A failed run's reason, from the ``run_failed`` record's ``error``: its type and
    message on one line, a long message's start and end kept (``_excerpt.shown``: the
    workflow's error may be a tool's 100 KB text); the whole is in the record."""
    return shown(f"{error.get('type')}: {error.get('message')}")


def cancelled_reason(payload: dict[str, Any]) -> str:
    """What a ``run_cancelled`` record says, for people: who, why, and the acts it left in
    flight (their outcome is reconciliation's to find, never guessed)."""
    why = f": {payload.get('reason')}" if payload.get("reason") else ""
    flight = [str(k) for k in payload.get("in_flight") or []]
    left = f"; in flight, left to reconciliation: {', '.join(flight)}" if flight else ""
    return f"cancelled by {payload.get('by')}{why}{left}"


def moved_reason(event: Event) -> str:
    """What a ``run_moved`` record says, for people: when, by whom, at which generation."""
    payloads.expect(event, EventType.RUN_MOVED)
    p = payloads.run_moved(event)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(p.get("time", 0.0))))
    return (
        f"exported as a move at generation {event.seq + 1} on {when} by {p.get('by')}; "
        "it continues where that checkpoint is imported"
    )


def _humans(events: Sequence[Event]) -> tuple[dict[str, Any], ...]:
    """Approvals and review decisions journaled into the run (expired ones included),
    each with whether it was consumed."""
    used = {
        payloads.consumption(e).get("nonce")
        for e in events
        if e.type in (EventType.APPROVAL_CONSUMED, EventType.REVIEW_CONSUMED)
    }
    out = []
    for e in events:
        if e.type not in (
            EventType.APPROVAL_GRANTED,
            EventType.APPROVAL_REJECTED,
            EventType.REVIEW_DECIDED,
        ):
            continue
        signed = payloads.signed_record(e)
        document = signed.get("approval") or signed.get("rejection") or signed.get("decision") or {}
        statement = document.get("statement") or {} if isinstance(document, dict) else {}
        out.append(
            {
                "seq": e.seq,
                "type": e.type.value,
                "step": e.key,
                "by": signed.get("by"),
                "signer": statement.get("approver") or statement.get("reviewer"),
                "decision": statement.get(
                    "decision", "reject" if e.type is EventType.APPROVAL_REJECTED else "approve"
                ),
                "expires_at": statement.get("expires_at"),
                "nonce": statement.get("nonce"),
                "consumed": statement.get("nonce") in used,
                **({"reason": statement.get("reason")} if "reason" in statement else {}),
            }
        )
    return tuple(out)
