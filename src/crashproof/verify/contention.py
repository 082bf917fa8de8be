"""Two recoverers at once: after a crash, two workers resume the same run.

Two variants, each after the case's first crash (``crash_once``):

- ``race``: two recoverers (two Ledger objects in two threads, or two child processes)
  start resuming the run at the same moment. One drives it; the other finds the lease
  held (``LeaseHeld``), or the run already finished.
- ``take-over``: the first recoverer resumes and, at its ``recovery_at``-th crash point,
  pauses while a second one resumes with ``take_over=True`` and drives the run to its end;
  then the first goes on. Its lease was taken: its next commit must raise
  ``StaleLeaseError`` — fenced out — and nothing it does may duplicate an effect.

Then a later resume (a new Ledger object) finishes whatever is left and the trial is
judged like any crash case: effects once per operation id, the reference's artifacts and
journal. A recoverer refused (LeaseHeld, StaleLeaseError) is what leases are for and is
noted in the reason; anything else a recoverer raises, but a freeze, DIVERGES.

``STALE_CHECKPOINT`` cases are in ``crashproof.verify.stale``; ``contention_case`` runs
either kind.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from crashproof._faults import CrashPoints
from crashproof.errors import LeaseHeld, RunFrozen, StaleLeaseError
from crashproof.verify.history import CrashSnapshot
from crashproof.verify.report import Case, CaseKind, CaseResult, Reference, Verdict
from crashproof.verify.scenario import Scenario, ScenarioError, close_env
from crashproof.verify.stale import stale_case
from crashproof.verify.trial_kit import (
    CHILD_TIMEOUT,
    GO,
    PAUSED_AT,
    Mode,
    NotReached,
    child_env,
    crash_once,
    env_dir,
    inspect_trial,
    open_ledger,
    resume_and_judge,
    run_scenario,
    take_snapshot,
)

__all__ = ["RACE", "TAKE_OVER", "VARIANTS", "contention_case"]

RACE = "race"
TAKE_OVER = "take-over"
VARIANTS = (RACE, TAKE_OVER)

_FINE = (LeaseHeld, StaleLeaseError, RunFrozen)  # refusals a recoverer may meet
_EXIT = {0: None, 3: "frozen", 4: "LeaseHeld", 5: "StaleLeaseError"}


def contention_case(
    scenario: Scenario[Any],
    reference: Reference,
    case: Case,
    directory: Path,
    mode: Mode,
    target: str | None,
) -> CaseResult:
    """Run a TWO_RECOVERERS or STALE_CHECKPOINT case in ``directory`` and judge it."""
    if mode == "powercut":
        raise ScenarioError(f"{case.kind.value} cases run in inproc or subprocess mode")
    if case.kind is CaseKind.STALE_CHECKPOINT:
        return stale_case(scenario, reference, case, directory, mode, target)
    crashes = [crash_once(scenario, directory, case, mode, target)]
    if case.variant == RACE:
        notes, problems = (
            _race_children(target, directory)
            if mode == "subprocess"
            else _race_threads(scenario, directory)
        )
        discount: dict[str, int] = {}
    elif case.variant == TAKE_OVER and case.recovery_at is not None:
        take = _take_over_children if mode == "subprocess" else _take_over_threads
        notes, problems, taken = take(scenario, directory, case.recovery_at, target)
        crashes += taken[:1]  # the first recoverer's state when the second took over
        after = inspect_trial(scenario, directory)
        # The first recoverer's calls after the take-over were made in vain (it learns
        # it was fenced out at its next commit): not counted against the run.
        discount = dict(Counter(after.calls) - Counter(taken[1].calls)) if taken else {}
    else:
        raise ValueError(f"unknown two-recoverers case: {case.label}")
    crashes.append(inspect_trial(scenario, directory))
    result = resume_and_judge(scenario, reference, case, directory, crashes, discount)
    return _merge(result, notes, problems)


def _merge(result: CaseResult, notes: list[str], problems: list[str]) -> CaseResult:
    if problems:
        reasons = [*problems, result.reason] if result.reason else problems
        return replace(result, verdict=Verdict.DIVERGED, reason="; ".join(reasons))
    reasons = [result.reason] if result.reason else []
    return replace(result, reason="; ".join([*reasons, *notes]))


def _outcome(who: str, exc: BaseException | None, notes: list[str], problems: list[str]) -> None:
    if exc is None:
        return
    text = f"{who}: {type(exc).__name__}: {exc}"
    (notes if isinstance(exc, _FINE) else problems).append(text)


# -- in-process: two Ledger objects, two threads -------------------------------------


def _recover(
    scenario: Scenario[Any],
    directory: Path,
    env: Any,
    *,
    take_over: bool = False,
    points: CrashPoints | None = None,
) -> BaseException | None:
    try:
        with open_ledger(directory, points) as ledger:
            run_scenario(scenario, ledger, env, take_over=take_over)
    except Exception as exc:
        return exc
    return None


def _race_threads(scenario: Scenario[Any], directory: Path) -> tuple[list[str], list[str]]:
    env = scenario.env_factory(env_dir(directory))  # one machine's targets, shared
    try:
        barrier = threading.Barrier(2)
        outcomes: list[BaseException | None] = [None, None]

        def recoverer(i: int) -> None:
            barrier.wait()
            outcomes[i] = _recover(scenario, directory, env)

        threads = [threading.Thread(target=recoverer, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(CHILD_TIMEOUT)
        notes: list[str] = []
        problems: list[str] = []
        if any(t.is_alive() for t in threads):
            problems.append(f"a recoverer hung ({CHILD_TIMEOUT:.0f} s)")
        for i, exc in enumerate(outcomes, start=1):
            _outcome(f"recoverer {i}", exc, notes, problems)
        return notes, problems
    finally:
        close_env(env)


def _take_over_threads(
    scenario: Scenario[Any], directory: Path, at: int, target: str | None
) -> tuple[list[str], list[str], list[CrashSnapshot]]:
    env = scenario.env_factory(env_dir(directory))
    notes: list[str] = []
    problems: list[str] = []
    taken: list[CrashSnapshot] = []
    try:

        def take_over(point: str) -> None:  # runs inside the first recoverer, paused
            with open_ledger(directory) as reader:
                taken.append(take_snapshot(scenario, env, reader))
            second: list[BaseException | None] = [None]

            def drive() -> None:
                second[0] = _recover(scenario, directory, env, take_over=True)

            thread = threading.Thread(target=drive)
            thread.start()
            thread.join(CHILD_TIMEOUT)
            if thread.is_alive():
                problems.append(f"the second recoverer hung ({CHILD_TIMEOUT:.0f} s)")
            _outcome(f"second recoverer (take-over at {point})", second[0], notes, problems)
            with open_ledger(directory) as reader:
                taken.append(take_snapshot(scenario, env, reader))

        points = CrashPoints(at=at, action=take_over)
        first = _recover(scenario, directory, env, points=points)
        if points.fired is None:
            raise NotReached(f"the first recoverer finished before its crash point #{at}")
        _fenced(first, notes, problems)
        return notes, problems, taken
    finally:
        close_env(env)


def _fenced(first: BaseException | None, notes: list[str], problems: list[str]) -> None:
    if first is None:
        notes.append("first recoverer: finished without another commit after the take-over")
    elif isinstance(first, StaleLeaseError):
        notes.append("first recoverer fenced out (StaleLeaseError)")
    else:
        _outcome("first recoverer", first, notes, problems)


# -- subprocess: two child processes ---------------------------------------------------


def _command(target: str | None, directory: Path, *flags: str) -> list[str]:
    if target is None:
        raise ScenarioError("subprocess mode needs the scenario's MODULE:ATTRIBUTE")
    module = "crashproof.verify._child"
    return [sys.executable, "-m", module, target, str(directory), "0", *flags]


def _exit(who: str, child: subprocess.Popen[str], notes: list[str], problems: list[str]) -> None:
    try:
        _, err = child.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        problems.append(f"{who} hung ({CHILD_TIMEOUT:.0f} s)")
        return
    code = child.returncode
    if code in _EXIT:
        if _EXIT[code] is not None:
            notes.append(f"{who}: {_EXIT[code]}")
        return
    tail = " ".join(err.strip().splitlines()[-3:])
    problems.append(f"{who} failed (exit {code}): {tail}")


def _spawn(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def _race_children(target: str | None, directory: Path) -> tuple[list[str], list[str]]:
    children = [_spawn(_command(target, directory)) for _ in range(2)]
    notes: list[str] = []
    problems: list[str] = []
    for i, child in enumerate(children, start=1):
        _exit(f"recoverer {i}", child, notes, problems)
    return notes, problems


def _take_over_children(
    scenario: Scenario[Any], directory: Path, at: int, target: str | None
) -> tuple[list[str], list[str], list[CrashSnapshot]]:
    notes: list[str] = []
    problems: list[str] = []
    taken: list[CrashSnapshot] = []
    paused, go = directory / PAUSED_AT, directory / GO
    first = _spawn(_command(target, directory, "--pause-at", str(at)))
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not paused.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if not paused.exists():
        go.touch()
        first.kill()
        first.communicate()
        raise NotReached(f"the first recoverer never reached its crash point #{at}")
    point = paused.read_text(encoding="utf-8")
    taken.append(inspect_trial(scenario, directory))
    second = _spawn(_command(target, directory, "--take-over"))
    _exit(f"second recoverer (take-over at {point})", second, notes, problems)
    taken.append(inspect_trial(scenario, directory))
    go.touch()
    _exit("first recoverer", first, notes, problems)
    notes[:] = [
        "first recoverer fenced out (StaleLeaseError)"
        if n == "first recoverer: StaleLeaseError"
        else n
        for n in notes
    ]
    paused.unlink(missing_ok=True)
    go.unlink(missing_ok=True)
    return notes, problems, taken
