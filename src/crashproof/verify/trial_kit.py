"""The parts every trial is built of: open the trial's ledger, crash the run (in-process or
in a child process), inspect what the crash left, resume and judge.

``crashproof.verify.trials`` (crash and double-crash cases), ``crashproof.verify.contention``
(two recoverers) and ``crashproof.verify.stale`` (stale checkpoints) build on this module;
the child process of subprocess mode (``crashproof.verify._child``) takes the trial layout
and the file names it signals with from here. This module imports none of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from crashproof._faults import CrashPoints
from crashproof.errors import RunFrozen, SimulatedCrash
from crashproof.runtime.ledger import Ledger
from crashproof.verify.history import (
    CrashSnapshot,
    check_decisions,
    check_effects,
    check_journal,
    check_redelivery,
    observe,
    read_run,
    recorded_decisions,
)
from crashproof.verify.powercut import DurableSnapshots, attach
from crashproof.verify.report import Case, CaseKind, CaseResult, Reference, Verdict
from crashproof.verify.scenario import Scenario, ScenarioError, close_env

__all__ = [
    "CHILD_TIMEOUT",
    "CRASHED_AT",
    "DURABILITY",
    "GO",
    "LEDGER_ENV",
    "PAUSED_AT",
    "RUNNING",
    "Mode",
    "NotReached",
    "child_env",
    "crash_child",
    "crash_inproc",
    "crash_once",
    "deliver_again",
    "discounted",
    "durable_snapshots",
    "env_dir",
    "inspect_trial",
    "ledger_url",
    "open_ledger",
    "resume_and_judge",
    "run_scenario",
    "take_snapshot",
]

Mode = Literal["inproc", "subprocess", "powercut", "chaos"]

# The default durability, as users run it. inproc and subprocess model a *process* crash
# (whatever was written survives it, synced or not); powercut also loses unsynced writes.
DURABILITY = "output"
CRASHED_AT = "crashed-at"  # a child writes the crash point's name here before dying
PAUSED_AT = "paused-at"  # a paused child writes the crash point's name here, then waits
GO = "go"  # ... until this file exists
RUNNING = "running"  # a child writes this once imported, just before it opens the ledger
CHILD_TIMEOUT = 120.0  # seconds; a child that hangs is killed and the case DIVERGES
LEDGER_ENV = "CRASHPROOF_VERIFY_LEDGER"  # a PostgreSQL URL for the trials' ledgers


class NotReached(Exception):
    """The run did not crash where the case said: the scenario is not deterministic."""


def env_dir(directory: Path) -> Path:
    path = directory / "env"
    path.mkdir(parents=True, exist_ok=True)
    return path


def ledger_url(directory: Path) -> str:
    """The trial's ledger: ``DIR/ledger.db``, or, with ``$CRASHPROOF_VERIFY_LEDGER`` (a
    PostgreSQL URL, set by ``verify(ledger=...)`` and inherited by the children), a schema
    of that database named after the trial directory, so a child and its judge meet."""
    base = os.environ.get(LEDGER_ENV)
    if not base:
        return f"sqlite:///{(directory / 'ledger.db').resolve()}"
    name = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    return f"{base}{'&' if '?' in base else '?'}schema=v_{name}"


def open_ledger(
    directory: Path, points: CrashPoints | None = None, *, powercut: bool = False
) -> Ledger:
    if not powercut:
        return Ledger(ledger_url(directory), durability=DURABILITY, crash_points=points)
    ledger = Ledger(ledger_url(directory), durability=DURABILITY, crash_points=points)
    try:
        attach(ledger, durable_snapshots(directory))
    except BaseException:
        ledger.close()
        raise
    return ledger


def durable_snapshots(directory: Path) -> DurableSnapshots:
    return DurableSnapshots((directory / "ledger.db").resolve(), directory / "durable")


def run_scenario(
    scenario: Scenario[Any], ledger: Ledger, env: Any, *, take_over: bool = False
) -> Any:
    """Start (or resume) the scenario's run, or take it over: through the sync entry
    points, or on an event loop of its own for an async workflow."""
    workflow = scenario.workflow_factory(env)
    run_id = scenario.resolved_run_id
    if take_over:
        ledger.register(workflow)
        if workflow.is_async:
            return asyncio.run(ledger.resume_async(run_id, take_over=True))
        return ledger.resume(run_id, take_over=True)
    if workflow.is_async:
        return asyncio.run(ledger.run_async(workflow, run_id=run_id, **scenario.inputs))
    return ledger.run(workflow, run_id=run_id, **scenario.inputs)


def take_snapshot(scenario: Scenario[Any], env: Any, ledger: Ledger) -> CrashSnapshot:
    calls = scenario.model_calls(env) if scenario.model_calls else {}
    info = read_run(ledger, scenario.resolved_run_id)
    return CrashSnapshot(
        calls={k: int(v) for k, v in calls.items()}, recorded=recorded_decisions(info)
    )


def inspect_trial(scenario: Scenario[Any], directory: Path) -> CrashSnapshot:
    env = scenario.env_factory(env_dir(directory))
    try:
        with open_ledger(directory) as ledger:
            return take_snapshot(scenario, env, ledger)
    finally:
        close_env(env)


def deliver_again(
    scenario: Scenario[Any], env: Any, directory: Path, first: Any, result: Any
) -> list[str]:
    """The same (finished) run delivered once more, to a new Ledger object."""
    with open_ledger(directory) as ledger:
        try:
            again = run_scenario(scenario, ledger, env)
        except Exception as exc:
            return [f"delivered again, the run raised {type(exc).__name__}: {exc}"]
        return check_redelivery(first, observe(scenario, env, ledger), result, again)


# -- crashing the run -----------------------------------------------------------------


def crash_once(
    scenario: Scenario[Any], directory: Path, case: Case, mode: Mode, target: str | None
) -> CrashSnapshot:
    """The case's first crash (a SimulatedCrash, or a SIGKILLed child in subprocess
    mode); returns what it left. Raises NotReached when the run passes another point."""
    if mode == "subprocess":
        fired: str | None = crash_child(target, directory, case.at)
    else:
        _, fired = crash_inproc(scenario, directory, case.at, inspect=False)
    if fired != case.point:
        raise NotReached(
            f"crashed at {fired!r}, not at {case.point!r} (#{case.at}): the run passes other "
            "crash points than before; is the scenario deterministic?"
        )
    return inspect_trial(scenario, directory)


def crash_inproc(
    scenario: Scenario[Any], directory: Path, at: int, *, inspect: bool, powercut: bool = False
) -> tuple[CrashSnapshot | None, str | None]:
    """Run (or resume) until the ``at``-th crash point raises SimulatedCrash; returns the
    point that fired and, if ``inspect``, the snapshot taken before the run started (what
    the previous crash left)."""
    env = scenario.env_factory(env_dir(directory))
    try:
        points = CrashPoints(at=at)
        with open_ledger(directory, points, powercut=powercut) as ledger:
            before = take_snapshot(scenario, env, ledger) if inspect else None
            try:
                run_scenario(scenario, ledger, env)
            except SimulatedCrash:
                return before, points.fired
            except Exception as exc:
                raise NotReached(
                    f"the run stopped before crash point #{at}: {type(exc).__name__}: {exc}"
                ) from exc
            raise NotReached(f"the run finished before crash point #{at}")
    finally:
        close_env(env)


def child_env() -> dict[str, str]:
    """This process's environment, with a PYTHONPATH under which a child process imports
    what this process can (the scenario's module among them)."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def crash_child(target: str | None, directory: Path, at: int) -> str:
    """Run the scenario in a child process that SIGKILLs itself at crash point ``at``."""
    if target is None:
        raise ScenarioError("subprocess mode needs the scenario's MODULE:ATTRIBUTE")
    command = [sys.executable, "-m", "crashproof.verify._child", target, str(directory), str(at)]
    try:
        child = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=CHILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise NotReached(
            f"the child hung before crash point #{at} ({CHILD_TIMEOUT:.0f} s)"
        ) from exc
    marker = directory / CRASHED_AT
    if child.returncode != -signal.SIGKILL or not marker.exists():
        tail = " ".join(child.stderr.strip().splitlines()[-3:])
        raise NotReached(
            f"the child was not killed at crash point #{at} (exit {child.returncode}): {tail}"
        )
    fired = marker.read_text(encoding="utf-8")
    marker.unlink()
    return fired


# -- resuming and judging -------------------------------------------------------------


def resume_and_judge(
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
        with open_ledger(directory, points) as ledger:
            crashes.append(discounted(take_snapshot(scenario, env, ledger), discount))
            result: Any = None
            stop: Exception | None = None
            try:
                result = run_scenario(scenario, ledger, env)
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
                problems += deliver_again(scenario, env, directory, obs, result)
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
