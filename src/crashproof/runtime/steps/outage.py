"""A service the run needs is out (``cp.Unavailable``: a model API's 429 or 5xx, a refused
connection, a timeout): wait and try again, or stop the run resumable. An outage is
never recorded as the call's failure: it says nothing about the run.

- The wait before the next attempt is the larger of the retry policy's delay and the
  service's own hint (``retry_after``, from ``Retry-After``), journaled with the failed
  attempt, so a crash during the wait resumes the wait.
- A hint beyond the policy's ``max_backoff`` stops the run at once rather than sleeping
  through it (a process asleep for an hour holds a lease and a thread, and a deploy or
  a crash in that hour wastes the wait anyway); ``resume`` after the hint tries again.
- When the attempts run out (a call without a retry policy has one), the run stops:
  a ``run_stopped`` record, reason ``unavailable:<key>: <message>`` (on one line; a
  long message keeps its start and its end around " … ", ``crashproof._excerpt``), the
  last attempt as evidence (the whole message), ``cp.RunStopped`` raised into the
  workflow and again from ``run``/``resume`` even if the workflow catches it. Nothing
  of the call is recorded as its result. A resume attempts it again with a fresh count
  (journal/fold.py), every recorded step, decision and act before it replayed.
- An act's stop names the operation id and the attempt that ended unavailable. That
  record, written by the runtime after ``execute`` raised and the last of the act's
  records (``ended_unavailable``), tells a resume the attempt was not done: it goes on
  as the drive would have, a new intent and ``execute``, no lookup (acts.py). Without it
  (a crash between the raise and the record) the act is in doubt and looked up first.
  When the tool said so of every attempt of the act (none in doubt before it: the
  drive's own retries after ``cp.RetryableError``), the stop says ``none_done``: the
  act then holds its intent against other runs no more (store/intents.py releases it,
  steps/holds.py), and its resume holds it again before it sends (acts.py).
- A lookup that keeps failing (the target of an act in doubt is down) stops the run the
  same way (``stop_lookup``): reason ``unavailable:<key>: lookup unavailable ...``; the
  resume looks again. Not a question for a person: nothing is in doubt but the wait.
  So does a resume's re-read of completed receipts whose lookups all raised
  ``cp.Unavailable`` (``stop_reread``): the tools said they are out, not that anything
  changed.

The ``unavailable:`` prefix is what makes the stop retryable (``store.queue.
retryable_stop``): a worker claims such a run again on its own, with backoff. An act
waiting for another run's unresolved act on its intent stops so too (``journal_stop``,
steps/holds.py), without the ``unavailable`` evidence: it was no attempt of the act.

Used by ``live.py`` (steps, decisions) and ``acts.py`` (an act whose tool's ``prepare``
or ``execute`` raised it: the effect did not happen).
"""

from __future__ import annotations

import math
import shlex
import time
from typing import Any, NoReturn

from crashproof._excerpt import shown
from crashproof.errors import RunStopped, Unavailable
from crashproof.journal import payloads
from crashproof.journal.codec import error_record
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.runtime.port import RunSession
from crashproof.store.queue import RETRYABLE_PREFIX

__all__ = [
    "ended_unavailable",
    "journal_stop",
    "none_done",
    "stop_lookup",
    "stop_reread",
    "stop_unavailable",
    "wait_for",
]


def wait_for(delay: float, exc: Unavailable, cap: float) -> float | None:
    """Seconds to wait before the next attempt (``delay``: the policy's), or None when
    the service asks for more than ``cap`` seconds: stop now, resume later."""
    hint = _hint(exc)
    if hint is None or hint <= delay:
        return delay
    return None if hint > cap else hint


def _hint(exc: Unavailable) -> float | None:
    hint = exc.retry_after
    if not isinstance(hint, int | float) or isinstance(hint, bool) or math.isnan(hint):
        return None  # no usable hint: the policy's delay
    return max(0.0, float(hint))  # inf: beyond any cap, so a stop


def stop_unavailable(
    session: RunSession,
    key: str,
    kind: str,
    exc: Unavailable,
    attempt: int,
    started: float,
    *,
    waits: bool = False,
    operation_id: str | None = None,
    none_done: bool = False,
) -> NoReturn:
    """Stop the run at call ``key`` (journaled) and raise ``RunStopped`` into the
    workflow. ``waits``: the service's hint is longer than the policy lets it wait;
    ``operation_id``: the act's whose ``attempt`` was unavailable after its intent;
    ``none_done``: the tool said of each attempt of that act that it was not done."""
    message = shown(str(exc)) or type(exc).__name__
    reason = f"{RETRYABLE_PREFIX}{key}: {message}"
    hint = _hint(exc)
    why = (
        f"the service asks to wait {hint:g} s, more than the retry policy's max_backoff"
        if waits and hint is not None
        else f"{kind} {key!r} was unavailable on attempt {attempt}"
    )
    run_id = session.run_id
    stopped = RunStopped(
        run_id,
        reason,
        detail=(
            f"{why}; nothing of it was recorded. Resume when the service is back: "
            f"Ledger.resume({run_id!r}) or crashproof resume {shlex.quote(run_id)} --app MODULE "
            "(every recorded step replays; the call is attempted again)"
        ),
    )
    evidence: dict[str, Any] = {
        "reason": reason,
        "next_step": key,  # the call attempted again on resume
        "next_kind": kind,
        "unavailable": {
            "kind": kind,
            "attempt": attempt,
            "error": error_record(exc),
            "retry_after": hint if hint is None or math.isfinite(hint) else None,
            "started_at": started,
            "ended_at": time.time(),
        },
    }
    if operation_id is not None:
        evidence["unavailable"]["operation_id"] = operation_id
        if none_done:  # releases the act's hold on its intent (store/intents.py)
            evidence["unavailable"]["none_done"] = True
    journal_stop(session, key, stopped, evidence)
    raise stopped from exc


def ended_unavailable(open_events: list[Event], operation_id: str, attempt: int) -> bool:
    """Whether the last of an act's open records (journal/fold.py) is this runtime's
    stop saying that ``attempt`` of ``operation_id``, the act's last intent, ended
    ``cp.Unavailable``: the tool declared it not done, and the record came after. A stop
    naming no operation id (an older writer's, or a ``prepare``'s) proves nothing here."""
    last = open_events[-1] if open_events else None
    if last is None or last.type is not EventType.RUN_STOPPED:
        return False
    seen = (payloads.run_stopped(last).get("evidence") or {}).get("unavailable")
    return (
        isinstance(seen, dict)
        and seen.get("kind") == "act"
        and seen.get("attempt") == attempt
        and seen.get("operation_id") == operation_id
    )


def none_done(open_events: list[Event]) -> bool:
    """Whether the last of an act's open records, a stop that ``ended_unavailable``
    accepts, also says no attempt of the act was done: the stop released the act's hold
    on its intent, and the next attempt must hold it again (acts.py)."""
    last = open_events[-1] if open_events else None
    if last is None or last.type is not EventType.RUN_STOPPED:
        return False
    seen = (payloads.run_stopped(last).get("evidence") or {}).get("unavailable")
    return isinstance(seen, dict) and seen.get("none_done") is True


def stop_lookup(
    session: RunSession,
    key: str,
    tool: str,
    failures: list[dict[str, Any]],
    evidence: dict[str, Any],
) -> NoReturn:
    """Stop the run at act ``key``, whose tool's lookups all failed (``failures``, their
    error records): journaled with the act's ``evidence``; ``RunStopped`` raised."""
    last = failures[-1].get("message") if failures else None
    said = shown(str(last or ""))
    reason = (
        f"{RETRYABLE_PREFIX}{key}: lookup unavailable ({tool} failed {len(failures)} lookups"
        + (f": {said})" if said else ")")
    )
    run_id = session.run_id
    stopped = RunStopped(
        run_id,
        reason,
        detail=(
            "whether the act happened is not known yet, and nothing was executed again; a "
            f"worker resumes it with backoff, or Ledger.resume({run_id!r}) / crashproof resume "
            f"{run_id} --app MODULE looks it up again"
        ),
    )
    stop = {"reason": reason, "next_step": key, "next_kind": "act", "lookup_errors": failures}
    journal_stop(session, key, stopped, {**evidence, **stop})
    raise stopped


def stop_reread(session: RunSession, key: str, checks: list[dict[str, Any]]) -> NoReturn:
    """Stop the run at completed act ``key``, the first of the ``checks`` (their JSON)
    whose receipt could not be re-read because its tool's lookup raised
    ``cp.Unavailable``; ``RunStopped`` raised. Nothing was executed."""
    said = shown(
        " ".join(str(checks[0].get("detail") or "").split()).removeprefix("lookup failed: ")
    )
    reason = (
        f"{RETRYABLE_PREFIX}{key}: the receipts of {len(checks)} completed act(s) could "
        f"not be re-read ({said})"
    )
    run_id = session.run_id
    stopped = RunStopped(
        run_id,
        reason,
        detail=(
            "their tools are out, nothing was executed; a worker resumes it with backoff, "
            f"or Ledger.resume({run_id!r}) / crashproof resume {shlex.quote(run_id)} "
            "--app MODULE reads them again"
        ),
    )
    journal_stop(session, key, stopped, {"reason": reason, "receipts": checks})
    raise stopped


def journal_stop(
    session: RunSession, key: str | None, stopped: RunStopped, evidence: dict[str, Any]
) -> None:
    """A clean, resumable stop (a service out, a budget, missing completion evidence):
    the ``run_stopped`` record, and every later ctx call raises ``stopped`` again,
    whatever the workflow catches; the ledger raises it when the workflow ends. The
    caller raises it now."""
    reason = stopped.reason
    session.append_event(
        EventType.RUN_STOPPED,
        key,
        payloads.as_dict(
            payloads.RunStopped(status=RunStatus.STOPPED.value, reason=reason, evidence=evidence)
        ),
        status=(RunStatus.STOPPED, reason),
    )
    session.halt(stopped, evidence)
