"""One trial: run a scenario from scratch, crash it where a case says, resume, judge.

Each trial has a directory of its own: ``env/`` (given to the scenario's environment
factory) and ``ledger.db`` (the journal). A crash is either in-process (a ``SimulatedCrash``
unwinds without any journal write; the Ledger object is thrown away), real (a child
process, ``python -m crashproof.verify._child``, dies by SIGKILL at the crash point), or a
power cut (in-process, in ``output`` durability; then the ledger's files and its witness's
go back to what each one's last sync made durable, see ``crashproof.verify.powercut``). The
resume always happens in this process, in a new ``Ledger`` object on the same file, with an
environment reopened from the same directory, as a restarted process would find them.

This module runs the reference and the crash and double-crash cases; the parts they share
with the two-recoverers and stale-checkpoint cases (``crashproof.verify.contention``,
``crashproof.verify.stale``) are in ``crashproof.verify.trial_kit``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from crashproof._faults import CrashPoints
from crashproof.errors import CrashproofError, SimulatedCrash
from crashproof.verify.chaos import chaos_case
from crashproof.verify.contention import contention_case
from crashproof.verify.history import CrashSnapshot, check_reference, observe, step_shape
from crashproof.verify.report import Case, CaseKind, CaseResult, Reference, Verdict
from crashproof.verify.scenario import Scenario, ScenarioError, close_env
from crashproof.verify.trial_kit import (
    Mode,
    NotReached,
    crash_child,
    crash_inproc,
    deliver_again,
    durable_snapshots,
    env_dir,
    inspect_trial,
    open_ledger,
    resume_and_judge,
    run_scenario,
)

# The names this module exported before the shared ones moved to trial_kit stay importable
# from here (crashproof.testing takes Mode from this module).
__all__ = ["run_case", "run_reference"]


# -- the reference run ----------------------------------------------------------


def run_reference(scenario: Scenario[Any], directory: Path) -> tuple[Reference, list[CaseResult]]:
    """The uninterrupted run, recording its crash points; then the same run delivered
    once more. Raises ScenarioError when the run does not succeed."""
    env = scenario.env_factory(env_dir(directory))
    try:
        points = CrashPoints()
        ledger = open_ledger(directory, points)
        started = time.perf_counter()
        try:
            result = run_scenario(scenario, ledger, env)
        except (CrashproofError, SimulatedCrash) as exc:
            raise ScenarioError(
                f"the reference run of scenario {scenario.name!r}, without any crash, did not "
                f"succeed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            seconds = time.perf_counter() - started
            ledger.close()
        if not points.passed:
            raise ScenarioError(f"scenario {scenario.name!r} passed no crash point")
        with open_ledger(directory) as reader:
            obs = observe(scenario, env, reader)
        if obs.fingerprint is None or obs.info is None:
            raise ScenarioError(f"scenario {scenario.name!r}: the reference run left no journal")
        reference = Reference(
            fingerprint=obs.fingerprint,
            result=result,
            points=tuple(points.passed),
            effects=obs.effects,
            model_calls=obs.model_calls,
            steps=step_shape(obs.info),
            seconds=seconds,
        )
        problems = check_reference(obs)
        rows = [
            CaseResult(
                case=Case(kind=CaseKind.REFERENCE),
                verdict=Verdict.DIVERGED if problems else Verdict.SAME,
                reason="; ".join(problems),
                fingerprint=obs.fingerprint,
                effects=obs.effects,
                model_calls=sum((obs.model_calls or {}).values()),
                seconds=seconds,
            )
        ]
        started = time.perf_counter()
        problems = deliver_again(scenario, env, directory, obs, result)
        rows.append(
            CaseResult(
                case=Case(kind=CaseKind.REDELIVERY),
                verdict=Verdict.DIVERGED if problems else Verdict.SAME,
                reason="; ".join(problems),
                fingerprint=obs.fingerprint,
                effects=obs.effects,
                model_calls=sum((obs.model_calls or {}).values()),
                seconds=time.perf_counter() - started,
            )
        )
        return reference, rows
    finally:
        close_env(env)


# -- crash trials ---------------------------------------------------------------------


def run_case(
    scenario: Scenario[Any],
    reference: Reference,
    case: Case,
    directory: Path,
    *,
    mode: Mode = "inproc",
    target: str | None = None,
) -> CaseResult:
    """Run ``case`` (a crash or a double crash) in ``directory`` and judge it."""
    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        if case.kind is CaseKind.CHAOS:
            result = chaos_case(scenario, reference, case, directory, target)
        elif case.kind in (CaseKind.TWO_RECOVERERS, CaseKind.STALE_CHECKPOINT):
            result = contention_case(scenario, reference, case, directory, mode, target)
        else:
            result = _case(scenario, reference, case, directory, mode, target)
    except NotReached as exc:
        result = CaseResult(case=case, verdict=Verdict.DIVERGED, reason=str(exc))
    except Exception as exc:  # the scenario's own code failed during the trial
        result = CaseResult(
            case=case,
            verdict=Verdict.DIVERGED,
            reason=f"the trial failed: {type(exc).__name__}: {exc}",
        )
    return _timed(result, time.perf_counter() - started)


def _case(
    scenario: Scenario[Any],
    reference: Reference,
    case: Case,
    directory: Path,
    mode: Mode,
    target: str | None,
) -> CaseResult:
    crashes: list[CrashSnapshot] = []
    plan = [(case.at, case.point)]
    if case.kind is CaseKind.DOUBLE_CRASH and case.recovery_at is not None:
        plan.append((case.recovery_at, case.recovery_point or ""))
    for number, (at, point) in enumerate(plan):
        fired: str | None
        if mode == "subprocess":
            if number:
                crashes.append(inspect_trial(scenario, directory))
            fired = crash_child(target, directory, at)
        else:
            before, fired = crash_inproc(
                scenario, directory, at, inspect=number > 0, powercut=mode == "powercut"
            )
            if before is not None:
                crashes.append(before)
            if mode == "powercut":
                durable_snapshots(directory).restore()  # the power comes back: only synced writes
        if fired != point:
            raise NotReached(
                f"crashed at {fired!r}, not at {point!r} (#{at}): the run passes other crash "
                "points than before; is the scenario deterministic?"
            )
    return resume_and_judge(scenario, reference, case, directory, crashes)


def _timed(result: CaseResult, seconds: float) -> CaseResult:
    return dataclasses.replace(result, seconds=seconds)
