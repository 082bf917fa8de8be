"""Budgets: what a run may consume, enforced before new work starts.

A run's ``cp.Limits`` are recorded in its first record (``run_started``), so every
resume, in any process, enforces the same limits; only a journaled ``budget_raised``
record (an operator's decision: who, when, old and new limits) changes them.

Enforcement point: before a ctx call would start *new* work — a live step, decision or
act, never a replayed one, never an act found in flight (that one is always reconciled
first) — the consumed totals are compared with the limits that call would go past:
every step, decision and act counts against ``steps`` and ``wall_time``; only a decision
spends ``decisions``, ``tokens`` and ``cost``, so a run out of tokens can still finish
its local steps and acts, but asks the model nothing more. When a limit is reached, the
run stops in ``stopped`` with ``stop_reason`` ``budget:<kind>``: a ``run_stopped``
record is committed, ``cp.RunStopped`` is raised into the workflow (and again from
``Ledger.run``/``resume``), and nothing more starts. The stop therefore always falls
after the last complete step and never inside an act. Tokens and cost are known only
once a decision returns, so the decision that crosses the limit completes (and counts)
and the stop comes before the next one.

Wall time runs from the run's first start (the ``run_started`` record), on the clock of
whichever host checks it, and keeps running while no process drives the run: a run that
crashed and is resumed an hour later has spent that hour. Raise ``wall_time`` to give it
more.
"""

from __future__ import annotations

import getpass
import math
import shlex
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from crashproof.errors import RunStopped
from crashproof.journal import payloads
from crashproof.journal.fold import Replay, spend
from crashproof.journal.records import (
    BUDGET_KINDS,
    Budget,
    Event,
    EventType,
    Limits,
    StepKind,
)
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.outage import journal_stop

__all__ = [
    "Meter",
    "budget_raised",
    "operator",
    "parse_raises",
    "raise_limits",
    "reached",
    "stopped_error",
]

# Floating-point sums of costs (0.1 + 0.2) must not slip under a limit they reached.
_EPSILON = 1e-9
# The limits a new call of each kind would go past.
_GATED = {
    StepKind.STEP.value: ("steps", "wall_time"),
    StepKind.ACT.value: ("steps", "wall_time"),
    StepKind.CHECK.value: ("steps", "wall_time"),
    StepKind.DECIDE.value: BUDGET_KINDS,
}


_NO_LIMITS = Limits()  # frozen


class Meter:
    """The consumed totals of one drive of a run, and the check before new work.

    Inert (two attribute reads per call) for runs without limits."""

    def __init__(self, replay: Replay) -> None:
        # Most runs have none: one shared empty Limits, not a parse per drive.
        self.limits = _NO_LIMITS if replay.limits is None else Limits.from_json(replay.limits)
        self.active = self.limits.active
        self.started_at = replay.started.created_at
        self.used = Budget()
        if self.active:  # every recorded step counts, replayed or not yet
            for event in replay.done:
                self.used = spend(self.used, payloads.step_done(event))

    def count(self, payload: dict[str, Any]) -> None:
        """A step finished live (called for every STEP_DONE the context commits)."""
        if self.active:
            self.used = spend(self.used, payloads.of(payloads.StepDone, payload))

    def check(self, session: RunSession, key: str, call: StepKind) -> None:
        """Stop the run (journaled, raises RunStopped) if the new ``call`` would go past
        a limit already reached."""
        if not self.active:
            return
        elapsed = time.time() - self.started_at
        kind = reached(self.limits, self.used, elapsed, call.value)
        if kind is not None:
            _stop(session, key, call, kind, self.limits, self.used, elapsed)


def reached(limits: Limits, used: Budget, elapsed: float, call: str) -> str | None:
    """The first budget kind a new ``call`` (step, decide, act) may not spend, or None."""
    spent: dict[str, float] = {
        "steps": used.steps,
        "decisions": used.decisions,
        "tokens": used.tokens,
        "cost": used.cost,
        "wall_time": elapsed,
    }
    for kind in _GATED.get(call, BUDGET_KINDS):
        limit = limits.get(kind)
        if limit is not None and spent[kind] >= limit - _EPSILON:
            return kind
    return None


def _usage(used: Budget, elapsed: float) -> dict[str, Any]:
    return {
        "steps": used.steps,
        "decisions": used.decisions,
        "tokens": used.tokens,
        "cost": used.cost,
        "wall_time": round(elapsed, 3),
    }


def stopped_error(
    run_id: str, kind: str, limits: Limits, used: Budget, elapsed: float
) -> RunStopped:
    """The RunStopped for a run whose ``kind`` limit is reached, with the way out."""
    spent = _usage(used, elapsed)[kind]
    unit = {"wall_time": "seconds of wall time", "cost": "cost"}.get(kind, kind)
    return RunStopped(
        run_id,
        f"budget:{kind}",
        used,
        limits,
        wall_seconds=elapsed,
        detail=(
            f"{spent} of {limits.get(kind)} {unit} used; nothing is in flight. To continue, "
            f"raise the limit: Ledger.resume({run_id!r}, raise_budget={{{kind!r}: N}}) or "
            f"crashproof resume {shlex.quote(run_id)} --app MODULE --raise-budget {kind}=N"
        ),
    )


def _stop(
    session: RunSession,
    key: str,
    call: StepKind,
    kind: str,
    limits: Limits,
    used: Budget,
    elapsed: float,
) -> NoReturn:
    exc = stopped_error(session.run_id, kind, limits, used, elapsed)
    evidence = {
        "reason": exc.reason,
        "limit": {"kind": kind, "limit": limits.get(kind), "used": _usage(used, elapsed)[kind]},
        "used": _usage(used, elapsed),
        "limits": limits.to_json(),
        "next_step": key,  # the call that did not start
        "next_kind": call.value,
    }
    journal_stop(session, key, exc, evidence)
    raise exc


# -- operator actions --------------------------------------------------------


def operator(by: str | None) -> dict[str, Any]:
    """Who takes an operator action: ``by`` or the OS user, and on which host."""
    if by is None:
        try:
            by = getpass.getuser()
        except Exception:  # no user name in this environment (a bare container)
            by = "unknown"
    if not isinstance(by, str) or not by.strip():
        raise ValueError("by= must name who takes the action (a non-empty string)")
    return {"by": by, "host": socket.gethostname()}


def raise_limits(current: Limits, changes: Mapping[str, Any]) -> Limits:
    """``current`` with the given kinds raised *to* new limits (None: unlimited).

    A raise never lowers a limit: that would stop a run by decree, not by budget.
    The same value again is allowed (and changes nothing), so a retried command is safe.
    """
    if not changes:
        raise ValueError("raise_budget needs at least one kind, e.g. {'tokens': 5000}")
    raised = current.with_limits(dict(changes))  # checks the kinds and values
    for kind in changes:
        old, new = current.get(kind), raised.get(kind)
        if new is not None and (old is None or new < old):
            was = "unlimited" if old is None else old
            raise ValueError(
                f"raise_budget {kind}={new} would lower the limit (now {was}); a raise "
                "sets a new, higher limit, not an increment"
            )
    return raised


def budget_raised(run_id: str, seq: int, old: Limits, new: Limits, who: dict[str, Any]) -> Event:
    """The journal record of a raise: who, where, old and new limits."""
    return Event(
        run_id=run_id,
        seq=seq,
        type=EventType.BUDGET_RAISED,
        key=None,
        payload={
            **who,
            "old": old.to_json(),
            "new": new.to_json(),
            "changed": {
                kind: [old.get(kind), new.get(kind)]
                for kind in BUDGET_KINDS
                if old.get(kind) != new.get(kind)
            },
        },
        created_at=time.time(),
    )


def parse_raises(pairs: Sequence[str]) -> dict[str, int | float | None]:
    """``["tokens=5000", "wall_time=600", "cost=none"]`` as raise_budget; ValueError if bad."""
    out: dict[str, int | float | None] = {}
    for pair in pairs:
        kind, sep, raw = pair.partition("=")
        kind = kind.strip().replace("-", "_")
        if not sep or kind not in BUDGET_KINDS:
            raise ValueError(
                f"--raise-budget {pair!r} is not KIND=VALUE with KIND one of "
                f"{', '.join(BUDGET_KINDS)}"
            )
        if kind in out:
            raise ValueError(f"--raise-budget {kind} is given twice")
        raw = raw.strip()
        if raw.lower() in ("none", "unlimited"):
            out[kind] = None
            continue
        try:
            value: int | float = (
                int(raw) if kind in ("steps", "decisions", "tokens") else float(raw)
            )
        except ValueError:
            raise ValueError(f"--raise-budget {kind}={raw!r}: not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--raise-budget {kind}={raw!r}: must be a non-negative number")
        out[kind] = value
    return out
