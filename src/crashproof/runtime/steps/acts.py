"""The act protocol: intent before effect, receipt after, reconciliation in between.

1. Journal the intent (step ``running``: operation id, intent digest, prepared data).
2. ``tool.execute(call)`` with the operation id as idempotency key.
3. Journal the receipt (step ``succeeded``).

An act found in flight on resume (intent without receipt, or ``unknown``) is never
retried blindly: the tool is asked to ``lookup`` first. Found with the same intent →
attach the receipt; found with another intent → ReceiptConflict, ``needs_review``;
definitely not found → execute once more with the same operation id, unless the
intent is older than the tool's ``idempotency_window`` (the target may have forgotten
the key: ``needs_review``, steps/windows.py); cannot tell → ``needs_review``. A tool
that cannot look up is settled by its recorded ``cp.OnUnknown`` (steps/unknown.py):
``review`` freezes, ``at_least_once`` sends again under the same operation id,
``at_most_once`` records the act as not done; never a silent guess. Not in flight: an
act whose last attempt the runtime's stop says ended ``cp.Unavailable`` (outage.py);
if no attempt was done, the stop released its hold, which the next attempt takes again.
"""

from __future__ import annotations

import time
from typing import Any

from crashproof._excerpt import shown
from crashproof.errors import (
    ActFailed,
    CrashproofError,
    DriftError,
    OutcomeUnknown,
    PermanentError,
    ReceiptConflict,
    ResourceBusy,
    RetryableError,
    StaleLeaseError,
    Unavailable,
)
from crashproof.journal import payloads
from crashproof.journal.codec import decode, encode, error_record, sha256_hex
from crashproof.journal.records import Event, EventType, StepKind
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.act_records import (
    failed_payload,
    hold_digest,
    intent_payload,
    receipt_evidence,
    receipt_json,
    receipt_payload,
)
from crashproof.runtime.steps.environment import (
    environment_fingerprint,
    observe_after,
    observe_before,
)
from crashproof.runtime.steps.expiry import before_execution, check_receipt
from crashproof.runtime.steps.handoff import Invoke, Pause, Work
from crashproof.runtime.steps.holds import first_intent
from crashproof.runtime.steps.outage import (
    ended_unavailable,
    none_done,
    stop_lookup,
    stop_unavailable,
    wait_for,
)
from crashproof.runtime.steps.scopes import act_scoped
from crashproof.runtime.steps.unknown import declared, record_not_done, recorded_declaration
from crashproof.runtime.steps.windows import IntentTime, first_intent_at, forgotten_key
from crashproof.tools.port import Call, OnUnknown, Tool

__all__ = ["perform_act"]

# Enum values read once: an enum member's .value is a Python-level descriptor call.
_ACT = StepKind.ACT.value


def perform_act(
    session: RunSession,
    key: str,
    tool: Tool,
    params: dict[str, Any],
    digest: str,
    open_events: list[Event],
    epoch: int = 1,
    approval: dict[str, Any] | None = None,
) -> Work[Any]:
    """Run (or recover) the act ``key`` live; returns the receipt's result. ``epoch``:
    above 1 after a reviewed replan quarantined the earlier operation ids (``@2``...)."""
    call = Call(
        run_id=session.run_id,
        step=key,
        operation_id=f"{session.run_id}/{key}" + (f"@{epoch}" if epoch > 1 else ""),
        intent_digest=digest,
        params=params,
        fencing_token=session.fencing_token,
        attempt=1,
        crash_point=session.crash_point_for(key),
        approval=approval,
    )
    if open_events:
        return (yield from _recover(session, tool, call, open_events))
    meaning = declared(tool)
    try:
        # A handoff (under the async shell a prepare that reads files or takes cp.Shell's
        # snapshot runs off the loop, as execute does); none for a tool without one.
        prepared = None
        if type(tool).prepare is not Tool.prepare:
            prepared = yield Invoke(tool.prepare, (call,), f"prepare of tool {tool.name!r}")
    except PermanentError as exc:  # the tool refuses the intent before anything happens
        failed = ActFailed(f"act {key!r} refused by {tool.name}: {shown(str(exc))}")
        _journal_failed(session, call, failed, exc, time.time(), failure="permanent")
        raise failed from exc
    except ResourceBusy as exc:
        yield from _freeze_busy(session, tool, call, exc)
    except Unavailable as exc:  # nothing journaled of the act yet: resume prepares again
        stop_unavailable(session, key, _ACT, exc, call.attempt, time.time())
    if prepared is not None:
        call = _with(call, prepared=prepared)
    return (yield from _first(session, tool, call, meaning, 0))


def _first(session: RunSession, tool: Tool, call: Call, how: OnUnknown, base: int) -> Work[Any]:
    """Journal ``call``'s intent as a first one, observed, and execute; while another
    run holds the intent unresolved the store refuses it and the run stops to wait
    (steps/holds.py). ``base``: earlier attempts, none done."""
    observed = yield from observe_before(tool, call)
    yield from first_intent(
        session,
        call,
        lambda overrides: _journal_intent(session, tool, call, how, observed, overrides, True),
    )
    return (yield from _execute(session, tool, call, how, base=base, none_before=True))


def _recover(session: RunSession, tool: Tool, call: Call, open_events: list[Event]) -> Work[Any]:
    intents = [e for e in open_events if e.type is EventType.ACT_INTENT]
    if not intents:
        raise CrashproofError(f"act {call.step!r}: journal holds no intent for an open act")
    last = intents[-1]
    intent = payloads.act_intent(last)
    if intent["digest"] != call.intent_digest:
        session.freeze(
            f"non-determinism at act {call.step!r}: the journaled intent for operation "
            f"{call.operation_id!r} has digest {intent['digest']}, the code now "
            f"produces {call.intent_digest}; nothing was executed",
            {
                "operation_id": call.operation_id,
                "journaled_digest": intent["digest"],
                "code_digest": call.intent_digest,
            },
            key=call.step,
        )
    recorded = last.value or {}
    call = _with(call, attempt=int(intent["attempt"]), prepared=recorded.get("prepared"))
    # This drive's retries are counted from here (a run stopped by an outage, or frozen
    # busy, gets a fresh count on resume); attempt numbers go on from the journal's.
    since = first_intent_at(intents, call.operation_id)
    meaning = recorded_declaration(last)  # the journal's, not the code's (steps/unknown.py)
    # Not in doubt: the next attempt, as in the drive; none done, no key to forget: held
    # again first (a run that acted on the intent since, unresolved, makes it wait, never
    # race). Else past a target's window an earlier attempt's key may be forgotten.
    if ended_unavailable(open_events, call.operation_id, call.attempt):
        if none_done(open_events):
            yield from before_execution(session, tool, call, _evidence)  # as _execute_again
            again = _with(call, attempt=call.attempt + 1)
            return (yield from _first(session, tool, again, meaning, base=call.attempt))
        if forgotten_key(tool.idempotency_window, since, session) is None:
            return (yield from _execute_again(session, tool, call, meaning, 0, call.attempt))
    return (yield from _reconcile(session, tool, call, meaning, base=call.attempt, since=since))


def _execute(
    session: RunSession,
    tool: Tool,
    call: Call,
    meaning: OnUnknown,
    rounds: int = 0,
    base: int = 0,
    *,
    none_before: bool = False,
) -> Work[Any]:
    """Execute, then journal the receipt, or classify the failure. ``meaning``: what an
    unknown outcome of this operation means (recorded with its first intent);
    ``rounds``: unknown outcomes met so far for this act in this process; ``base``: the
    attempts made before this drive (not counted against its retries); ``none_before``:
    the tool said no earlier attempt of the act was done (so may a stop: outage.py)."""
    settings = session.act_settings
    while True:
        # Never sent past its approval's expiry (steps/expiry.py): the first try, a retry.
        yield from before_execution(session, tool, call, _evidence)
        started = time.time()
        try:
            execute = act_scoped(tool.execute, session.call_scopes, call, "act")
            receipt = yield Invoke(execute, (call,), f"execute of tool {tool.name!r}")
        except PermanentError as exc:
            failed = ActFailed(f"act {call.step!r} failed permanently: {shown(str(exc))}")
            _journal_failed(session, call, failed, exc, started, failure="permanent")
            raise failed from exc
        except RetryableError as exc:
            tries = call.attempt - base
            delay: float | None = None
            if tries < settings.retryable_attempts:
                delay = settings.delay(tries)
                if isinstance(exc, Unavailable):  # the service's hint, or a stop (outage.py)
                    delay = wait_for(delay, exc, settings.max_backoff)
            if delay is None:
                if isinstance(exc, ResourceBusy):
                    yield from _freeze_busy(session, tool, call, exc)
                if isinstance(exc, Unavailable):  # not done: the run stops, resumable
                    waits = tries < settings.retryable_attempts
                    stop_unavailable(
                        session,
                        call.step,
                        _ACT,
                        exc,
                        call.attempt,
                        started,
                        waits=waits,
                        operation_id=call.operation_id,
                        none_done=none_before,  # each retry here followed a RetryableError
                    )
                failed = ActFailed(
                    f"act {call.step!r} failed after {call.attempt} attempts: {shown(str(exc))}"
                )
                _journal_failed(session, call, failed, exc, started, failure="retryable")
                raise failed from exc
            yield Pause(delay)
            call = _with(call, attempt=call.attempt + 1)
            _journal_intent(session, tool, call, meaning)
            continue
        except DriftError as exc:
            yield from _freeze_drift(session, tool, call, exc)
        except StaleLeaseError:
            raise  # another worker owns the run: stop here, record nothing
        except Exception as exc:  # timeouts, dropped connections, anything else: unknown
            unknown = error_record(exc)
            session.append_event(
                EventType.ACT_UNKNOWN,
                call.step,
                payloads.as_dict(
                    payloads.ActUnknown(
                        kind=_ACT,
                        digest=call.intent_digest,
                        operation_id=call.operation_id,
                        attempt=call.attempt,
                        error=unknown,
                        started_at=started,
                        ended_at=time.time(),
                    )
                ),
            )
            return (
                yield from _reconcile(session, tool, call, meaning, rounds + 1, base, cause=unknown)
            )
        return (
            yield from _journal_receipt(session, tool, call, receipt, started, reconciled=False)
        )


def _reconcile(
    session: RunSession,
    tool: Tool,
    call: Call,
    meaning: OnUnknown,
    rounds: int = 0,
    base: int = 0,
    since: IntentTime | None = None,
    cause: dict[str, Any] | None = None,
) -> Work[Any]:
    """Lookup first; never a blind retry. ``since``: the journal's time of the first
    intent of this operation id, when recovering an act left in flight; ``cause``: the
    error that left the outcome unknown in this drive, if one did."""
    settings = session.act_settings
    if not tool.supports_lookup:
        forgotten = forgotten_key(tool.idempotency_window, since, session)
        if tool.idempotent_execute and forgotten is None:
            return (yield from _execute_again(session, tool, call, meaning, rounds, base))
        if meaning is not OnUnknown.REVIEW:
            return (yield from _settle(session, tool, call, meaning, rounds, base, cause))
        evidence = {**(yield from _evidence(call, tool)), "no_lookup": True}
        if forgotten is not None:  # a deduping target past its window: a resend may repeat
            why, times = forgotten
            session.freeze(
                f"act {call.step!r} ({tool.name}) may or may not have happened, the tool "
                f"cannot look it up, and {why}: not re-executed automatically",
                {**evidence, "idempotency_window": times},
                key=call.step,
            )
        session.freeze(
            f"act {call.step!r} ({tool.name}) may or may not have happened, and the tool "
            "cannot look it up: not re-executed automatically",
            evidence,
            key=call.step,
        )
    failures: list[dict[str, Any]] = []
    for attempt in range(1, settings.lookup_attempts + 1):
        started = time.time()
        try:
            lookup = act_scoped(tool.lookup, session.call_scopes, call, "lookup")
            found = yield Invoke(lookup, (call,), f"lookup of tool {tool.name!r}")
        except OutcomeUnknown as exc:
            evidence = yield from _evidence(call, tool)
            session.freeze(
                f"act {call.step!r}: {tool.name} cannot tell whether operation "
                f"{call.operation_id!r} happened ({shown(str(exc))}); a later resume looks it "
                "up again",
                {**evidence, "lookup_error": error_record(exc)},
                key=call.step,
                retryable=True,
            )
        except DriftError as exc:
            yield from _freeze_drift(session, tool, call, exc)
        except NotImplementedError as exc:  # no lookup for this act: no retry helps
            if meaning is not OnUnknown.REVIEW:
                return (yield from _settle(session, tool, call, meaning, rounds, base, cause))
            # A tool may say why this act cannot be looked up (cp.Shell: an external command).
            why = (
                "the tool does not implement lookup (set supports_lookup = False, or implement it)"
            )
            evidence = yield from _evidence(call, tool)
            if type(tool).lookup is not Tool.lookup and str(exc):
                why = shown(str(exc))
                evidence = {**evidence, "lookup_error": error_record(exc)}  # all of its words
            session.freeze(
                f"act {call.step!r} ({tool.name}) may or may not have happened, and {why}: "
                "not re-executed automatically",
                evidence,
                key=call.step,
            )
        except Exception as exc:
            failures.append(error_record(exc))
            if attempt < settings.lookup_attempts:
                yield Pause(settings.delay(attempt))
            continue
        if found is None:
            forgotten = forgotten_key(tool.idempotency_window, since, session)
            if forgotten is not None:
                why, times = forgotten
                evidence = yield from _evidence(call, tool)
                session.freeze(
                    f"act {call.step!r}: {tool.name} does not know operation "
                    f"{call.operation_id!r}, but {why}; not re-executed",
                    {**evidence, "idempotency_window": times},
                    key=call.step,
                )
            return (yield from _execute_again(session, tool, call, meaning, rounds, base))
        return (yield from _journal_receipt(session, tool, call, found, started, reconciled=True))
    stop_lookup(session, call.step, tool.name, failures, (yield from _evidence(call, tool)))


def _settle(
    session: RunSession,
    tool: Tool,
    call: Call,
    meaning: OnUnknown,
    rounds: int,
    base: int,
    cause: dict[str, Any] | None,
) -> Work[Any]:
    """An unknown outcome nothing can look up, settled as declared: sent again under the
    same operation id (``at_least_once``), or recorded as not done (``at_most_once``)."""
    if meaning is OnUnknown.AT_LEAST_ONCE:
        return (yield from _execute_again(session, tool, call, meaning, rounds, base))
    record_not_done(
        session,
        call,
        tool,
        "the tool declares at_most_once",
        cause,
        on_unknown=meaning.value,
    )


def _execute_again(
    session: RunSession, tool: Tool, call: Call, meaning: OnUnknown, rounds: int, base: int
) -> Work[Any]:
    """Not done (or not knowable, but safe to repeat): execute once more with the same
    operation id. Bounded: after ``retryable_attempts`` unknown outcomes in a row, stop
    for a later resume instead of hammering a target that keeps failing."""
    settings = session.act_settings
    # An approved act found not done past its approval's expiry waits for a fresh one.
    yield from before_execution(session, tool, call, _evidence)
    if rounds >= settings.retryable_attempts:
        session.freeze(
            f"act {call.step!r}: {tool.name} left the outcome unknown {rounds} times in a "
            "row and found nothing done; a later resume tries again",
            (yield from _evidence(call, tool)),
            key=call.step,
            retryable=True,
        )
    if rounds:
        yield Pause(settings.delay(rounds))
    call = _with(call, attempt=call.attempt + 1)
    _journal_intent(session, tool, call, meaning)
    return (yield from _execute(session, tool, call, meaning, rounds, base))


def _journal_intent(
    session: RunSession,
    tool: Tool,
    call: Call,
    meaning: OnUnknown,
    observed: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    first: bool = False,
) -> None:
    payload = intent_payload(tool, call, time.time(), observed)
    if overrides:
        payload["overrides"] = overrides
    if first:  # what other runs' holds match: no tool version (steps/holds.py)
        payload["hold_digest"] = hold_digest(tool, call.params, call.step)
    if tool.idempotency_window is not None and session.server_clock:
        payload["server_at"] = session.ledger_now()  # the window's clock (steps/windows.py)
    if meaning is not OnUnknown.REVIEW:  # absent: review (every older journal's meaning)
        payload["on_unknown"] = meaning.value
    session.append_event(
        EventType.ACT_INTENT,
        call.step,
        payloads.as_dict(payload),
        encode(
            {"params": call.params, "prepared": call.prepared},
            what=f"the params/prepared data of act {call.step!r}",
        ),
    )


def _journal_receipt(
    session: RunSession, tool: Tool, call: Call, receipt: Any, started: float, *, reconciled: bool
) -> Work[Any]:
    value_json, problem = receipt_json(receipt, call.step)
    if problem:
        evidence = yield from _evidence(call, tool)
        session.freeze(
            f"act {call.step!r}: {tool.name} returned an invalid receipt ({problem}); the "
            "effect may have happened, so it is not re-executed",
            {**evidence, "receipt_repr": repr(receipt)[:2000]},
            key=call.step,
        )
    if receipt.intent_digest is not None and receipt.intent_digest != call.intent_digest:
        evidence = yield from _evidence(call, tool)
        session.freeze(
            f"receipt conflict at act {call.step!r}: {tool.name} holds operation "
            f"{call.operation_id!r} with intent {receipt.intent_digest}, the journal's "
            f"intent is {call.intent_digest}; nothing else executes",
            {**evidence, "receipt": receipt_evidence(receipt)},
            key=call.step,
            error=ReceiptConflict,
        )
    if call.approval is not None:  # committed within its approval? (steps/expiry.py)
        yield from check_receipt(session, tool, call, receipt, _evidence)
    if (
        receipt.intent_digest is None
        and not tool.matches_intent
        and (reconciled or tool.idempotent_execute)
    ):
        # A found effect, or the answer of a target that dedupes by key (it may replay
        # the stored answer of another caller's request under the same key), is this
        # act's only when the target shows the intent (001: a key reused with another
        # intent must conflict; a lookup that cannot tell is no match).
        how = "holds" if reconciled else "answered"
        evidence = yield from _evidence(call, tool)
        session.freeze(
            f"act {call.step!r}: {tool.name} {how} operation {call.operation_id!r} but "
            "cannot show which intent (its receipt has no intent digest), so it is not "
            "taken as this act's effect; nothing else executes. Review the receipt. A tool "
            "should return the digest the target stored with the operation id "
            "(cp.Receipt(..., intent_digest=...)), or declare matches_intent when "
            "its target matches key and intent",
            {**evidence, "receipt": receipt_evidence(receipt)},
            key=call.step,
            error=ReceiptConflict,
        )
    payload = receipt_payload(
        tool,
        call,
        receipt.receipt_id,
        sha256_hex(value_json.encode()),
        reconciled,
        int((time.time() - started) * 1e6),
        (yield from observe_after(tool, call.step)),  # the environment as the act left it
    )
    if receipt.intent_digest is not None:  # a re-read must find it again (reconcile.py)
        payload["receipt"]["intent_bound"] = True
    session.append_event(EventType.STEP_DONE, call.step, payloads.as_dict(payload), value_json)
    return decode(value_json)


def _journal_failed(
    session: RunSession,
    call: Call,
    failed: ActFailed,
    cause: Exception,
    started: float,
    failure: str,
) -> None:
    """Record a failure the tool vouched for; replay raises the same ActFailed."""
    done = failed_payload(call, error_record(failed), error_record(cause), started, failure)
    session.append_event(EventType.STEP_DONE, call.step, payloads.as_dict(done))


def _freeze_drift(session: RunSession, tool: Tool, call: Call, exc: DriftError) -> Work[None]:
    evidence = yield from _evidence(call, tool)
    session.freeze(
        f"act {call.step!r}: the target drifted ({shown(str(exc))}); nothing was executed",
        {**evidence, "drift": error_record(exc)},
        key=call.step,
        error=DriftError,
    )


def _freeze_busy(session: RunSession, tool: Tool, call: Call, exc: ResourceBusy) -> Work[None]:
    evidence = yield from _evidence(call, tool)
    session.freeze(
        f"act {call.step!r}: {shown(str(exc))}; a later resume tries again",
        {**evidence, "busy": error_record(exc)},
        key=call.step,
        retryable=True,
    )


def _evidence(call: Call, tool: Tool) -> Work[dict[str, Any]]:
    evidence: dict[str, Any] = {
        "operation_id": call.operation_id,
        "intent_digest": call.intent_digest,
        "attempt": call.attempt,
        "params": call.params,
    }
    # The environment as the case froze, for a tool that observes one: a decision on the
    # case is consumed only while it still holds (runtime/guards/replan.py).
    seen = yield from environment_fingerprint(tool)
    if seen is not None:
        evidence["environment_fingerprint"] = seen
    return evidence


def _with(call: Call, **changes: Any) -> Call:
    fields = {name: getattr(call, name) for name in _CALL_FIELDS}
    fields.update(changes)
    return Call(**fields)


_CALL_FIELDS = tuple(Call.__dataclass_fields__)
