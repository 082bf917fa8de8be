"""One trial: run a scenario from scratch, crash it where a case says, resume, judge.

Each trial has a directory of its own: ``env/`` (given to the scenario's environment
factory) and ``ledger.db`` (the journal). A crash is either in-process (a ``SimulatedCrash``
unwinds without any journal write; the Ledger object is thrown away), real (a child
process, ``python -m crashproof.verify._child``, dies by SIGKILL at the crash point), or a
power cut (in-process, in ``output`` durability; then the ledger files go back to what its
last forced sync made durable, see ``crashproof.verify.powercut``). The
resume always happens here, in a new ``Ledger`` object on the same file, with an
environment reopened from the same directory, as a restarted process would find them.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from crashproof._faults import CrashPoints
from crashproof.errors import CrashproofError, RunFrozen, SimulatedCrash
from crashproof.runtime.ledger import Ledger
from crashproof.verify.history import (
    CrashSnapshot,
    check_decisions,
    check_effects,
    check_journal,
    check_redelivery,
    check_reference,
    observe,
    read_run,
    recorded_decisions,
    step_shape,
)
from crashproof.verify.powercut import DurableSnapshots, attach
from crashproof.verify.report import Case, CaseKind, CaseResult, Reference, Verdict
from crashproof.verify.scenario import Scenario, ScenarioError, close_env

__all__ = [
    "CHILD_TIMEOUT",
    "CRASHED_AT",
    "crash_once",
    "discounted",
    "DURABILITY",
    "Mode",
    "env_dir",
    "ledger_url",
    "run_case",
    "run_reference",
]

Mode = Literal["inproc", "subprocess", "powercut"]

# The default durability, as users run it. inproc and subprocess model a *process* crash
# (whatever was written survives it, synced or not); powercut also loses unsynced writes.
DURABILITY = "output"
CRASHED_AT = "crashed-at"  # a child writes the crash point's name here before dying
CHILD_TIMEOUT = 120.0  # seconds; a child that hangs is killed and the case DIVERGES


class _NotReached(Exception):
    """The run did not crash where the case said: the scenario is not deterministic."""


def env_dir(directory: Path) -> Path:
    path = directory / "env"
    path.mkdir(parents=True, exist_ok=True)
    return path


def ledger_url(directory: Path) -> str:
    return f"sqlite:///{(directory / 'ledger.db').resolve()}"


def _ledger(
    directory: Path, points: CrashPoints | None = None, *, powercut: bool = False
) -> Ledger:
    if not powercut:
        return Ledger(ledger_url(directory), durability=DURABILITY, crash_points=points)
    ledger = Ledger(ledger_url(directory), durability=DURABILITY, crash_points=points)
    try:
        attach(ledger, _snapshots(directory))
    except BaseException:
        ledger.close()
        raise
    return ledger


def _snapshots(directory: Path) -> DurableSnapshots:
    return DurableSnapshots((directory / "ledger.db").resolve(), directory / "durable")


def _run(scenario: Scenario[Any], ledger: Ledger, env: Any) -> Any:
    workflow = scenario.workflow_factory(env)
    return ledger.run(workflow, run_id=scenario.resolved_run_id, **scenario.inputs)


def _snapshot(scenario: Scenario[Any], env: Any, ledger: Ledger) -> CrashSnapshot:
    calls = scenario.model_calls(env) if scenario.model_calls else {}
    info = read_run(ledger, scenario.resolved_run_id)
    return CrashSnapshot(
        calls={k: int(v) for k, v in calls.items()}, recorded=recorded_decisions(info)
    )


# -- the reference run ----------------------------------------------------------


def run_reference(scenario: Scenario[Any], directory: Path) -> tuple[Reference, list[CaseResult]]:
    """The uninterrupted run, recording its crash points; then the same run delivered
    once more. Raises ScenarioError when the run does not succeed."""
    env = scenario.env_factory(env_dir(directory))
    try:
        points = CrashPoints()
        ledger = _ledger(directory, points)
        started = time.perf_counter()
        try:
            result = _run(scenario, ledger, env)
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
        with _ledger(directory) as reader:
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
        problems = _deliver_again(scenario, env, directory, obs, result)
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


def _deliver_again(
    scenario: Scenario[Any], env: Any, directory: Path, first: Any, result: Any
) -> list[str]:
    """The same (finished) run delivered once more, to a new Ledger object."""
    with _ledger(directory) as ledger:
        try:
            again = _run(scenario, ledger, env)
        except Exception as exc:
            return [f"delivered again, the run raised {type(exc).__name__}: {exc}"]
        return check_redelivery(first, observe(scenario, env, ledger), result, again)


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
        if case.kind in (CaseKind.TWO_RECOVERERS, CaseKind.STALE_CHECKPOINT):
            # Imported here: those modules build on this one.
            from crashproof.verify.contention import contention_case

            result = contention_case(scenario, reference, case, directory, mode, target)
        else:
            result = _case(scenario, reference, case, directory, mode, target)
    except _NotReached as exc:
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
                crashes.append(_inspect(scenario, directory))
            fired = _crash_child(target, directory, at)
        else:
            before, fired = _crash_inproc(
                scenario, directory, at, inspect=number > 0, powercut=mode == "powercut"
            )
            if before is not None:
                crashes.append(before)
            if mode == "powercut":
                _snapshots(directory).restore()  # the power comes back: only synced writes
        if fired != point:
            raise _NotReached(
                f"crashed at {fired!r}, not at {point!r} (#{at}): the run passes other crash "
                "points than before; is the scenario deterministic?"
            )
    return _resume_and_judge(scenario, reference, case, directory, crashes)


def crash_once(
    scenario: Scenario[Any], directory: Path, case: Case, mode: Mode, target: str | None
) -> CrashSnapshot:
    """The case's first crash (a SimulatedCrash, or a SIGKILLed child in subprocess
    mode); returns what it left. Raises _NotReached when the run passes another point."""
    if mode == "subprocess":
        fired: str | None = _crash_child(target, directory, case.at)
    else:
        _, fired = _crash_inproc(scenario, directory, case.at, inspect=False)
    if fired != case.point:
        raise _NotReached(
            f"crashed at {fired!r}, not at {case.point!r} (#{case.at}): the run passes other "
            "crash points than before; is the scenario deterministic?"
        )
    return _inspect(scenario, directory)


def _crash_inproc(
    scenario: Scenario[Any], directory: Path, at: int, *, inspect: bool, powercut: bool = False
) -> tuple[CrashSnapshot | None, str | None]:
    """Run (or resume) until the ``at``-th crash point raises SimulatedCrash; returns the
    point that fired and, if ``inspect``, the snapshot taken before the run started (what
    the previous crash left)."""
    env = scenario.env_factory(env_dir(directory))
    try:
        points = CrashPoints(at=at)
        with _ledger(directory, points, powercut=powercut) as ledger:
            before = _snapshot(scenario, env, ledger) if inspect else None
            try:
                _run(scenario, ledger, env)
            except SimulatedCrash:
                return before, points.fired
            except Exception as exc:
                raise _NotReached(
                    f"the run stopped before crash point #{at}: {type(exc).__name__}: {exc}"
                ) from exc
            raise _NotReached(f"the run finished before crash point #{at}")
    finally:
        close_env(env)


def _inspect(scenario: Scenario[Any], directory: Path) -> CrashSnapshot:
    env = scenario.env_factory(env_dir(directory))
    try:
        with _ledger(directory) as ledger:
            return _snapshot(scenario, env, ledger)
    finally:
        close_env(env)


def _crash_child(target: str | None, directory: Path, at: int) -> str:
    """Run the scenario in a child process that SIGKILLs itself at crash point ``at``."""
    if target is None:
        raise ScenarioError("subprocess mode needs the scenario's MODULE:ATTRIBUTE")
    env = dict(os.environ)
    paths = [p for p in sys.path if p]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)  # the child imports what this process can
    command = [sys.executable, "-m", "crashproof.verify._child", target, str(directory), str(at)]
    try:
        child = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise _NotReached(
            f"the child hung before crash point #{at} ({CHILD_TIMEOUT:.0f} s)"
        ) from exc
    marker = directory / CRASHED_AT
    if child.returncode != -signal.SIGKILL or not marker.exists():
        tail = " ".join(child.stderr.strip().splitlines()[-3:])
        raise _NotReached(
            f"the child was not killed at crash point #{at} (exit {child.returncode}): {tail}"
        )
    fired = marker.read_text(encoding="utf-8")
    marker.unlink()
    return fired


def _resume_and_judge(
    scenario: Scenario[Any],
    reference: Reference,
    case: Case,
    directory: Path,
    crashes: list[CrashSnapshot],
    discount: dict[str, int] | None = None,
) -> CaseResult:
    """Resume the run in a new Ledger object and judge it. ``discount``: model calls not
    to count (those a fenced-out recoverer made in vain after the take-over)."""
    env = scenario.env_factory(env_dir(directory))
    try:
        points = CrashPoints()  # records the points the recovery passes
        with _ledger(directory, points) as ledger:
            crashes.append(discounted(_snapshot(scenario, env, ledger), discount))
            result: Any = None
            stop: Exception | None = None
            try:
                result = _run(scenario, ledger, env)
            except Exception as exc:
                stop = exc
            obs = observe(scenario, env, ledger)
        if discount and obs.model_calls is not None:
            obs = dataclasses.replace(obs, model_calls=_minus(obs.model_calls, discount))
        finished = stop is None
        problems, extra = check_effects(reference, obs, finished=finished)
        decisions, reasked = check_decisions(
            reference.model_calls, crashes, obs.model_calls, finished=finished
        )
        problems += decisions
        verdict, reason = Verdict.SAME, ""
        if finished:
            if obs.fingerprint != reference.fingerprint:
                problems.insert(0, f"fingerprint {obs.fingerprint} is not the reference's")
            problems += check_journal(reference, obs.info)
            if case.kind is CaseKind.CRASH:  # (double crashes spend their time on recovery)
                problems += _deliver_again(scenario, env, directory, obs, result)
        elif isinstance(stop, RunFrozen):
            verdict, reason = Verdict.REFUSED, f"{stop.status}: {stop.reason}"
        else:
            problems.insert(0, f"the resume raised {type(stop).__name__}: {stop}")
        if problems:
            verdict, reason = Verdict.DIVERGED, "; ".join(problems)
        return CaseResult(
            case=case,
            verdict=verdict,
            reason=reason,
            fingerprint=obs.fingerprint,
            effects=obs.effects,
            extra_effects=extra,
            model_calls=None if obs.model_calls is None else sum(obs.model_calls.values()),
            reasked=reasked,
            recovery_points=tuple(points.passed),
        )
    finally:
        close_env(env)


def discounted(snapshot: CrashSnapshot, discount: dict[str, int] | None) -> CrashSnapshot:
    if not discount:
        return snapshot
    return dataclasses.replace(snapshot, calls=_minus(snapshot.calls, discount))


def _minus(calls: dict[str, int], discount: dict[str, int]) -> dict[str, int]:
    left = {k: n - discount.get(k, 0) for k, n in calls.items()}
    return {k: n for k, n in left.items() if n > 0}


def _timed(result: CaseResult, seconds: float) -> CaseResult:
    return dataclasses.replace(result, seconds=seconds)
