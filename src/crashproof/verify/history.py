"""The history check: what a trial left behind, judged against the reference run.

As in Jepsen, the verdict comes from two independent histories: the journal's (which
intents were recorded, which acts were acknowledged with a receipt, which decisions were
recorded) and the targets' own records (which effects landed, how often, which model calls
were made). A trial is equivalent to the reference when

- every effect has an intent: its operation id is an act in the journal;
- none is duplicated: no operation id landed more often than in the reference;
- none is lost: every acknowledged act's effect is there (for a finished run: all of them);
- none is left indeterminate: a finished run has no act still running or unknown;
- no recorded decision is asked again: only a decision whose answer a crash lost before
  its commit may be asked once more (once per such crash);
- the journal has the reference's shape (same steps, kinds and statuses), and the
  artifacts have the reference's fingerprint.

Every function returns the problems it found as sentences; no problem means equivalent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crashproof.errors import RunNotFound
from crashproof.journal.records import RunInfo, StepKind, StepStatus
from crashproof.runtime.ledger import Ledger
from crashproof.verify.report import Reference
from crashproof.verify.scenario import Scenario

__all__ = [
    "CrashSnapshot",
    "Observation",
    "check_decisions",
    "check_effects",
    "check_journal",
    "check_redelivery",
    "check_reference",
    "intents",
    "observe",
    "read_run",
    "recorded_decisions",
    "step_shape",
]

_OPEN = (StepStatus.RUNNING, StepStatus.UNKNOWN)


@dataclass(frozen=True, slots=True)
class Observation:
    """A run as the journal and the targets show it."""

    info: RunInfo | None  # None: the run was never recorded
    fingerprint: str | None
    effects: dict[str, int] | None
    model_calls: dict[str, int] | None


@dataclass(frozen=True, slots=True)
class CrashSnapshot:
    """What was known right after a crash: the model calls made so far, and the decisions
    the journal held (their answers survived the crash)."""

    calls: dict[str, int]
    recorded: frozenset[str]


def read_run(ledger: Ledger, run_id: str) -> RunInfo | None:
    try:
        return ledger.get_run(run_id)
    except RunNotFound:
        return None


def observe(
    scenario: Scenario[Any], env: Any, ledger: Ledger, *, fingerprint: bool = True
) -> Observation:
    """Read the run from the journal and the artifacts and records from ``env``."""
    return Observation(
        info=read_run(ledger, scenario.resolved_run_id),
        fingerprint=scenario.fingerprint(env) if fingerprint else None,
        effects=_counts(scenario.effects(env)) if scenario.effects else None,
        model_calls=_counts(scenario.model_calls(env)) if scenario.model_calls else None,
    )


def recorded_decisions(info: RunInfo | None) -> frozenset[str]:
    if info is None:
        return frozenset()
    return frozenset(
        s.key for s in info.steps if s.kind is StepKind.DECIDE and s.status not in _OPEN
    )


def step_shape(info: RunInfo | None) -> tuple[tuple[str, str, str], ...]:
    if info is None:
        return ()
    return tuple((s.key, s.kind.value, s.status.value) for s in info.steps)


def check_reference(obs: Observation) -> list[str]:
    """The uninterrupted run: one effect per operation id, each with an intent."""
    problems = []
    intents = _intents(obs.info)
    for op, n in sorted((obs.effects or {}).items()):
        if op not in intents:
            problems.append(f"effect without intent: {op} (no act of the journal has this id)")
        elif n != 1:
            problems.append(f"not one effect per operation id: {op} landed {n} times")
    return problems


def check_effects(
    reference: Reference,
    obs: Observation,
    *,
    finished: bool,
    other_intents: frozenset[str] = frozenset(),
) -> tuple[list[str], dict[str, int]]:
    """Effects against intents and the reference; returns (problems, count differences).
    ``other_intents``: operation ids whose intents another journal of the run holds (a
    run resumed from a stale checkpoint finds effects the original journal explains)."""
    if reference.effects is None or obs.effects is None:
        return [], {}
    problems: list[str] = []
    extra: dict[str, int] = {}
    intents, acked = _intents(obs.info) | other_intents, _acked(obs.info)
    for op in sorted(set(reference.effects) | set(obs.effects)):
        got, want = obs.effects.get(op, 0), reference.effects.get(op, 0)
        if got != want:
            extra[op] = got - want
        if got and op not in intents:
            problems.append(f"effect without intent: {op} landed {got}x, no act has this id")
        elif got > want:
            problems.append(f"duplicated effect: {op} landed {got}x, the reference {want}x")
        elif got < want and op in acked:
            problems.append(f"lost effect: {op} landed {got}x though its receipt is journaled")
        elif got < want and finished:
            problems.append(f"lost effect: {op} landed {got}x, the reference {want}x")
    return problems, extra


def check_journal(reference: Reference, info: RunInfo | None) -> list[str]:
    """A finished run: no act left indeterminate, and the reference's steps."""
    if info is None:
        return ["the run is not in the journal"]
    problems = []
    left = [s.key for s in info.steps if s.kind is StepKind.ACT and s.status in _OPEN]
    if left:
        problems.append(f"acts left unreconciled: {', '.join(left)}")
    shape = step_shape(info)
    if shape != reference.steps:
        problems.append(_first_difference(reference.steps, shape))
    return problems


def check_decisions(
    reference: dict[str, int] | None,
    crashes: Sequence[CrashSnapshot],
    final: dict[str, int] | None,
    *,
    finished: bool,
) -> tuple[list[str], tuple[str, ...]]:
    """Model calls: zero for decisions recorded before a crash; one more for a decision
    whose answer a crash lost (asked, not yet committed), per such crash. Returns the
    problems and the decisions legitimately asked again."""
    if reference is None or final is None:
        return [], ()
    problems: list[str] = []
    allowed: Counter[str] = Counter()
    before: dict[str, int] = {}
    ends = [c.calls for c in crashes[1:]] + [final]
    for number, (crash, after) in enumerate(zip(crashes, ends, strict=False), start=1):
        for key, n in crash.calls.items():
            if n > before.get(key, 0) and key not in crash.recorded:
                allowed[key] += 1  # asked during the crashed attempt, answer not recorded
        for key in sorted(crash.recorded):
            again = after.get(key, 0) - crash.calls.get(key, 0)
            if again > 0:
                problems.append(
                    f"decision {key!r} was recorded before crash {number} and asked "
                    f"{again} more time(s) on resume"
                )
        before = crash.calls
    reasked = []
    for key in sorted(set(reference) | set(final)):
        got, want = final.get(key, 0), reference.get(key, 0)
        if got - want > allowed[key]:
            problems.append(
                f"decision {key!r} asked {got}x, the reference {want}x "
                f"({allowed[key]} lost answer(s) allow {want + allowed[key]})"
            )
        elif got > want:
            reasked.append(key)
        elif got < want and finished:
            problems.append(f"decision {key!r} asked {got}x, the reference {want}x")
    return problems, tuple(reasked)


def check_redelivery(
    first: Observation, again: Observation, result: Any, result_again: Any
) -> list[str]:
    """The finished run delivered once more: nothing executes, nothing changes."""
    problems = []
    if result_again != result:
        problems.append("delivered again, the run returned another result")
    if again.info != first.info:
        problems.append("delivered again, the run's journal changed")
    if again.effects != first.effects:
        problems.append(f"delivered again, effects changed: {first.effects} -> {again.effects}")
    if again.model_calls != first.model_calls:
        problems.append("delivered again, the model was asked again")
    if again.fingerprint != first.fingerprint:
        problems.append("delivered again, the artifacts changed")
    return problems


def _counts(raw: dict[str, int]) -> dict[str, int]:
    return {str(k): int(v) for k, v in raw.items() if int(v)}


def intents(info: RunInfo | None) -> frozenset[str]:
    """The operation ids of the run's acts: the effects its journal explains."""
    return frozenset(_intents(info))


def _intents(info: RunInfo | None) -> set[str]:
    if info is None:
        return set()
    return {s.operation_id for s in info.steps if s.kind is StepKind.ACT and s.operation_id}


def _acked(info: RunInfo | None) -> set[str]:
    if info is None:
        return set()
    return {
        s.operation_id
        for s in info.steps
        if s.kind is StepKind.ACT and s.operation_id and s.status is StepStatus.SUCCEEDED
    }


def _first_difference(
    want: tuple[tuple[str, str, str], ...], got: tuple[tuple[str, str, str], ...]
) -> str:
    for i, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            return f"journal differs at step {i + 1}: reference {'/'.join(w)}, got {'/'.join(g)}"
    return f"journal has {len(got)} steps, the reference {len(want)}"
