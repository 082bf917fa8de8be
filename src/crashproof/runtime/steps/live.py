"""A step, a decision or a recorded clock/random value run live: the function called (a
handoff, ``handoff.py``), retried under its ``RetryPolicy``, and its outcome recorded.

A failed attempt that will be retried is journaled (``attempt_failed``, with the wait),
so a crash during the wait resumes the wait instead of starting over. A service out
(``cp.Unavailable``) that outlasts the retries stops the run resumable instead of
failing the call (``outage.py``). The final outcome is one ``step_done`` record: the
JSON result (and a decision's model, usage and cost), or the error replay raises again.
A BaseException (a crash point, a cancelled task) records nothing: the step is run
again on resume, as after a crash. Neither does an error of the ledger itself
(``LedgerError``, DESIGN.md §11 invariant 8): it stops the drive
(``session.store_failed``); a commit of this drive that failed before or during the call
is thrown in as ``StoreFailed``, a BaseException, and passes through likewise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from crashproof.errors import CrashproofError, LedgerError, Unavailable
from crashproof.journal import payloads
from crashproof.journal.codec import decode, encode, error_record
from crashproof.journal.records import EventType, StepKind, StepStatus
from crashproof.runtime.options import Decision, RetryPolicy, StepOptions
from crashproof.runtime.port import StepSession
from crashproof.runtime.steps.decisions import check_decision
from crashproof.runtime.steps.handoff import Invoke, Pause, Work
from crashproof.runtime.steps.outage import stop_unavailable, wait_for
from crashproof.runtime.steps.scopes import LiveCall, scoped

__all__ = ["live_call"]

_NO_RETRY = RetryPolicy(attempts=1)
# What errors and handoffs name, per kind (formatted with the key only when used).
_RESULT_OF = {kind: f"the result of {kind.value}" for kind in StepKind}
_INLINE = (StepKind.NOW, StepKind.RANDOM, StepKind.UUID)  # no I/O: never a thread


def live_call(
    session: StepSession,
    kind: StepKind,
    key: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    digest: str,
    options: StepOptions | None,
) -> Work[Any]:
    """Run ``fn`` for the call ``key`` and record its outcome; returns what replay will
    return (the decoded JSON: tuples become lists...)."""
    policy = (options.retry if options else None) or _NO_RETRY
    earlier = session.earlier_attempts(key)
    attempt = 1
    if earlier:  # a crash interrupted the wait after a failed attempt: finish waiting
        attempt = len(earlier) + 1
        last = payloads.attempt_failed(earlier[-1])
        remaining = float(last["ended_at"]) + float(last["retry_in"]) - time.time()
        if remaining > 0:
            yield Pause(remaining)
    what = f"{kind.value} {key!r}"
    invoke = Invoke(fn, args, what, kwargs, inline=kind in _INLINE)
    scopes = session.call_scopes
    while True:
        if scopes:  # an observer's scope around the body (steps/scopes.py); free without
            call = LiveCall(
                run_id=session.run_id,
                kind=kind.value,
                key=key,
                attempt=attempt,
                seq=session.next_seq,
                fencing_token=session.fencing_token,
            )
            invoke = Invoke(scoped(fn, scopes, call), args, what, kwargs, kind in _INLINE)
        started = time.time()
        error: Exception | None = None
        session.enter_step(key)
        try:
            out = yield invoke
        except Exception as exc:
            error = exc
        finally:
            nested = session.leave_step()
        if error is not None:
            if nested:
                raise error  # a misuse of ctx, not the step's outcome: record nothing
            if isinstance(error, LedgerError):  # the ledger's failure, never the call's
                session.store_failed(error)
            ended = time.time()
            delay = _delay(policy, attempt, error)
            if delay is None and isinstance(error, Unavailable):  # never the call's failure
                waits = attempt < policy.attempts and policy.retries(error)
                stop_unavailable(session, key, kind.value, error, attempt, started, waits=waits)
            if delay is not None:
                session.append_event(
                    EventType.ATTEMPT_FAILED,
                    key,
                    payloads.as_dict(
                        payloads.AttemptFailed(
                            kind=kind.value,
                            digest=digest,
                            attempt=attempt,
                            error=error_record(error),
                            started_at=started,
                            ended_at=ended,
                            retry_in=delay,
                        )
                    ),
                )
                yield Pause(delay)
                attempt += 1
                continue
            session.append_event(
                EventType.STEP_DONE,
                key,
                payloads.as_dict(
                    payloads.StepDone(
                        kind=kind.value,
                        digest=digest,
                        status=StepStatus.FAILED.value,
                        attempt=attempt,
                        error=error_record(error),
                        started_at=started,
                        ended_at=ended,
                    )
                ),
            )
            raise error
        # The step ended when its record is made (the record's created_at); its duration
        # as whole microseconds: an int is far cheaper to write than two float timestamps
        # (journal/fold.py reads both forms).
        ended = time.time()
        took = int((ended - started) * 1e6)
        spent = None
        if isinstance(out, Decision):
            if kind is not StepKind.DECIDE:
                raise CrashproofError(f"{kind} {key!r} returned a Decision; use ctx.decide")
            check_decision(out, key)
            spent = {"model": out.model, "usage": out.usage, "cost": out.cost}
            out = out.value
        value_json = encode(out, what=_RESULT_OF[kind], key=key)
        session.record_done(kind, key, digest, attempt, took, spent, ended, value_json)
        return decode(value_json)


def _delay(policy: RetryPolicy, attempt: int, error: Exception) -> float | None:
    """Seconds before the next attempt, or None: no next attempt (the retries ran out,
    or a service out asks for a longer wait than the policy allows, ``outage.py``)."""
    if attempt >= policy.attempts or not policy.retries(error):
        return None
    delay = policy.delay(attempt)
    if isinstance(error, Unavailable):
        return wait_for(delay, error, policy.max_backoff)
    return delay
