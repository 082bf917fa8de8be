"""Chaos mode: wall-clock kills of the whole process group, where no crash point is.

The other modes crash a run *at* a crash point, which is where the runtime expects to be
interrupted. A real machine kills a process anywhere: in the middle of a ``git add`` or a
test run a tool started as a child process (whose lock files and half-written files stay
behind), inside SQLite, between two syscalls. A chaos trial therefore runs the scenario in
a child process (``python -m crashproof.verify._child``, as subprocess mode) in a process
group of its own, and SIGKILLs the *group* after a random delay; with some probability the
recovery, a second child, is killed the same way (a double crash). The run is then resumed
in this process and judged exactly as every other case (``resume_and_judge``): the
reference's fingerprint, one effect per operation id, no recorded decision asked again;
a REFUSED run names why it stopped.

Each delay counts from the moment the child, imported and with its environment open,
is about to open the ledger (it writes ``DIR/running``), and is drawn with the seed from
``[0, 1.1 x`` the time a child takes from there to the end of the run (measured once,
``calibrate``)``]``: the kills spread over opening the ledger (and recovering its WAL),
the replay, the live steps and the tools' child processes, and some trials end before
their kill (``finished``). Each result records what its kills hit (``CaseResult.chaos``);
``Report.chaos_counts`` sums them.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from crashproof.verify.history import CrashSnapshot
from crashproof.verify.report import Case, CaseKind, CaseResult, Reference
from crashproof.verify.scenario import Scenario, ScenarioError
from crashproof.verify.trial_kit import (
    CHILD_TIMEOUT,
    RUNNING,
    child_env,
    inspect_trial,
    resume_and_judge,
)

__all__ = ["DOUBLE_CRASH_RATE", "calibrate", "chaos_case", "chaos_cases"]

DOUBLE_CRASH_RATE = 0.3  # trials whose recovery is killed too
_SPREAD = 1.1  # delays reach a little past a whole run: some trials finish first


def calibrate(target: str, directory: Path) -> float:
    """Seconds a child process takes from opening the ledger to the end of the run."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "child.log", "ab") as log:
        child = _start(target, directory, log)
        running = _wait_running(child, directory)
        child.wait(timeout=CHILD_TIMEOUT)
    if child.returncode != 0 or running is None:
        tail = " ".join((directory / "child.log").read_text().strip().splitlines()[-3:])
        raise ScenarioError(
            f"chaos mode: the scenario did not finish in a child process (exit "
            f"{child.returncode}): {tail}"
        )
    return max(time.monotonic() - running, 0.001)


def chaos_cases(trials: int, span: float, rng: random.Random) -> list[Case]:
    """``trials`` cases; each kills its first child after a delay drawn from
    ``[0, 1.1 x span]``, and a share of them their recovery too."""
    cases = []
    for number in range(1, trials + 1):
        delays = [round(rng.uniform(0.0, _SPREAD), 4)]
        if rng.random() < DOUBLE_CRASH_RATE:
            delays.append(round(rng.uniform(0.0, _SPREAD), 4))
        cases.append(Case(kind=CaseKind.CHAOS, at=number, delays=tuple(delays), span=span))
    return cases


def chaos_case(
    scenario: Scenario[Any],
    reference: Reference,
    case: Case,
    directory: Path,
    target: str | None,
) -> CaseResult:
    """Run the case's children, each killed (process group) after its delay unless it
    ends first; then resume here and judge."""
    if target is None:
        raise ScenarioError("chaos mode needs the scenario's MODULE:ATTRIBUTE")
    crashes: list[CrashSnapshot] = []
    kills = tool_kills = 0
    finished = False
    for number, delay in enumerate(case.delays):
        if number:
            crashes.append(inspect_trial(scenario, directory))
        killed, in_tool = _run_and_kill(target, directory, delay * case.span)
        kills += killed
        tool_kills += in_tool
        if not killed:
            finished = True  # the run ended (or stopped) first: nothing left to kill
            break
    result = resume_and_judge(scenario, reference, case, directory, crashes)
    chaos = {
        "kills": kills,
        "kills_during_tool_child": tool_kills,
        "double_crash": kills > 1,
        "finished_before_kill": finished and kills == 0,
    }
    return CaseResult(
        case=result.case,
        verdict=result.verdict,
        reason=result.reason,
        fingerprint=result.fingerprint,
        effects=result.effects,
        extra_effects=result.extra_effects,
        model_calls=result.model_calls,
        reasked=result.reasked,
        recovery_points=result.recovery_points,
        chaos=chaos,
    )


def _command(target: str, directory: Path) -> list[str]:
    # N = 0: no crash point armed, the child runs (or resumes) the scenario to its end.
    return [sys.executable, "-m", "crashproof.verify._child", target, str(directory), "0"]


def _start(target: str, directory: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    (directory / RUNNING).unlink(missing_ok=True)
    return subprocess.Popen(
        _command(target, directory),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=child_env(),
        start_new_session=True,  # its own group: the kill takes git and test runners too
    )


def _wait_running(child: subprocess.Popen[bytes], directory: Path) -> float | None:
    """The monotonic time the child signalled it opens the ledger; None if it ended first."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not (directory / RUNNING).exists():
        if child.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.002)
    return time.monotonic()


def _run_and_kill(target: str, directory: Path, delay: float) -> tuple[bool, bool]:
    """Start a child in a new process group; SIGKILL the group ``delay`` seconds after it
    starts opening the ledger. Returns (killed, whether a process the child started was
    running then)."""
    with open(directory / "child.log", "ab") as log:
        child = _start(target, directory, log)
        running = _wait_running(child, directory)
        try:
            left = delay if running is None else delay - (time.monotonic() - running)
            child.wait(timeout=max(left, 0.0))
            return False, False
        except subprocess.TimeoutExpired:
            pass
        in_tool = _has_children(child.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        try:
            child.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:  # cannot happen to a SIGKILLed group; say so
            raise ScenarioError(f"chaos mode: child {child.pid} survived SIGKILL") from None
        if child.returncode != -signal.SIGKILL:
            return False, False  # it exited between the timeout and the kill
        return True, in_tool


def _has_children(pid: int) -> bool:
    """Whether ``pid`` has a child process now, started by any of its threads (Linux:
    /proc; elsewhere unknown, so False)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        with contextlib.suppress(OSError):
            if (task / "children").read_text().split():
                return True
    return False
