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

The faults of production (``faults``, drawn per trial with the seed; ``kill`` alone by
default, which draws exactly as before):

- ``kill``: the above; the recovery is a plain resume.
- ``worker``: every child drives the run as a ``crashproof worker`` (``_child --worker``:
  enqueued, claimed from the queue, a 1 s lease) and is killed the same way; then one
  more worker, not killed, must take the run over once the dead one's lease runs out and
  finish it with nobody resuming it. A worker that does not is a finding (``DIVERGED``).
- ``outage``: one worker drives the run while the scenario's services (its model: the
  ``Scenario.outage`` hook) are down from the trial's delay for ``OUTAGE_SECONDS``, longer
  than a call's retries: the run stops (``unavailable:...``) and the worker must resume it
  by itself, with backoff, once they are back.

- ``powercut``: a kill that is a power cut, witness included: every child keeps the last
  durable state of each file the ledger depends on (the ledger, its ``-wal``, the witness
  and its ``-wal``, each as of its own last fsync: crashproof.verify.powercut, as
  ``--mode powercut``), and after each kill those files go back to it, every unsynced
  write lost, before anything reads them (the recovery, the judge). A run refused after
  the cut (``WitnessMissing``, ``JournalRolledBack``) is stuck (REFUSED).

- ``restart``: the store crashes and restarts while one worker drives the run: the
  verifier runs the command it was given (``$CRASHPROOF_VERIFY_RESTART``, the CLI's
  ``--pg-restart-command``, e.g. ``pg_ctl -D DATA -m immediate -w restart``) at the
  trial's delay; the worker must finish the run by itself once the server is back. Only
  for a PostgreSQL ledger (``--ledger-url``): the verifier restarts no server it was not
  told how to control, and a SQLite file has no server (``verify`` refuses the fault
  then, as not applicable).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from crashproof.journal import payloads
from crashproof.journal.records import EventType
from crashproof.store.queue import RETRYABLE_PREFIX
from crashproof.verify.history import CrashSnapshot, read_run, recorded_decisions
from crashproof.verify.report import Case, CaseKind, CaseResult, Reference, Verdict
from crashproof.verify.scenario import Scenario, ScenarioError, close_env
from crashproof.verify.trial_kit import (
    CHILD_TIMEOUT,
    RUNNING,
    child_env,
    durable_snapshots,
    env_dir,
    inspect_trial,
    open_ledger,
    resume_and_judge,
)

__all__ = [
    "DOUBLE_CRASH_RATE",
    "FAULTS",
    "OUTAGE_SECONDS",
    "RESTART_ENV",
    "calibrate",
    "chaos_case",
    "chaos_cases",
]

DOUBLE_CRASH_RATE = 0.3  # trials whose recovery is killed too
FAULTS = ("kill", "worker", "outage", "powercut", "restart")
RESTART_ENV = "CRASHPROOF_VERIFY_RESTART"  # the command that restarts the store
OUTAGE_SECONDS = 1.5  # a service down this long: past any retry the examples' calls make
_SPREAD = 1.1  # delays reach a little past a whole run: some trials finish first


def calibrate(target: str, directory: Path) -> float:
    """Seconds a child process takes from opening the ledger to the end of the run."""
    directory.mkdir(parents=True, exist_ok=True)
    with _started(target, directory) as child:
        running = _wait_running(child, directory)
        child.wait(timeout=CHILD_TIMEOUT)
    if child.returncode != 0 or running is None:
        tail = " ".join((directory / "child.log").read_text().strip().splitlines()[-3:])
        raise ScenarioError(
            f"chaos mode: the scenario did not finish in a child process (exit "
            f"{child.returncode}): {tail}"
        )
    return max(time.monotonic() - running, 0.001)


def chaos_cases(
    trials: int, span: float, rng: random.Random, faults: Sequence[str] = ("kill",)
) -> list[Case]:
    """``trials`` cases; each kills its first child after a delay drawn from
    ``[0, 1.1 x span]``, and a share of them their recovery too (an ``outage`` trial: its
    services go down after that delay instead; a ``powercut`` trial's kills are power
    cuts). ``faults``: drawn per trial (module docstring); the variant of a ``kill``
    trial is None."""
    unknown = sorted(set(faults) - set(FAULTS))
    if not faults or unknown:
        raise ValueError(f"faults must be some of {', '.join(FAULTS)}, not {list(faults)}")
    cases = []
    for number in range(1, trials + 1):
        fault = faults[0] if len(faults) == 1 else rng.choice(list(faults))
        delays = [round(rng.uniform(0.0, _SPREAD), 4)]
        if fault not in ("outage", "restart") and rng.random() < DOUBLE_CRASH_RATE:
            delays.append(round(rng.uniform(0.0, _SPREAD), 4))
        variant = None if fault == "kill" else fault
        cases.append(
            Case(kind=CaseKind.CHAOS, at=number, delays=tuple(delays), span=span, variant=variant)
        )
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
    kills = tool_kills = lost_writes = 0
    finished = False
    worker = case.variant in ("worker", "outage", "restart")
    cut = case.variant == "powercut"
    unattended: str | None = None  # why the workers did not finish the run by themselves
    delay = case.delays[0] * case.span
    if case.variant == "outage":
        finished, unattended = _outage(scenario, target, directory, delay)
    elif case.variant == "restart":

        def restart() -> None:
            _restart_store()
            crashes.append(_durable_snapshot(scenario, directory))

        finished, unattended = _while_a_worker_drives(target, directory, delay, restart)
    else:
        for number, delay in enumerate(case.delays):
            if number:
                crashes.append(inspect_trial(scenario, directory))
            killed, in_tool = _run_and_kill(target, directory, delay * case.span, worker, cut)
            if killed and cut:  # the power came back: what the disk kept, nothing more
                before = _ledger_files(directory)
                durable_snapshots(directory).restore()
                lost_writes += before != _ledger_files(directory)
            kills += killed
            tool_kills += in_tool
            if not killed:
                finished = True  # the run ended (or stopped) first: nothing left to kill
                break
        if worker and kills:  # the next worker takes the dead one's run over
            crashes.append(inspect_trial(scenario, directory))
            unattended = _last_worker(target, directory)
    result = resume_and_judge(scenario, reference, case, directory, crashes)
    chaos = {
        "kills": kills,
        "kills_during_tool_child": tool_kills,
        "double_crash": kills > 1,
        "finished_before_kill": finished and kills == 0,
        "power_cuts": kills if cut else 0,
        "cuts_that_lost_writes": lost_writes,  # the rest found every write synced already
        "store_restarts": int(case.variant == "restart" and not finished),
    }
    if worker:  # what the workers met, from the journal
        chaos.update(_journaled(scenario, directory))
    verdict, reason = result.verdict, result.reason
    if unattended is not None and verdict is Verdict.SAME:
        verdict, reason = Verdict.DIVERGED, unattended  # it needed the judge's resume
    return CaseResult(
        case=result.case,
        verdict=verdict,
        reason=reason,
        fingerprint=result.fingerprint,
        effects=result.effects,
        extra_effects=result.extra_effects,
        model_calls=result.model_calls,
        reasked=result.reasked,
        recovery_points=result.recovery_points,
        chaos=chaos,
    )


def _outage(
    scenario: Scenario[Any], target: str, directory: Path, delay: float
) -> tuple[bool, str | None]:
    """One worker drives the run; its services go down ``delay`` seconds after it opens
    the ledger, for ``OUTAGE_SECONDS``. Returns (the run ended before the outage began,
    why the worker did not finish it by itself, or None)."""
    hook = scenario.outage
    if hook is None:
        raise ScenarioError(
            f"chaos fault 'outage': scenario {scenario.name!r} has no outage hook "
            "(Scenario(outage=...): make its model raise cp.Unavailable while down)"
        )
    where = env_dir(directory)

    def outage() -> None:
        hook(where, True)
        try:
            time.sleep(OUTAGE_SECONDS)
        finally:
            hook(where, False)

    return _while_a_worker_drives(target, directory, delay, outage)


def _restart_store() -> None:
    """Run the store's restart command (``RESTART_ENV``); it must exit 0 with the server
    back, as ``pg_ctl -w restart`` does."""
    command = os.environ.get(RESTART_ENV, "")
    if not command:
        raise ScenarioError(f"chaos fault 'restart': no restart command (${RESTART_ENV})")
    try:
        done = subprocess.run(
            command, shell=True, capture_output=True, text=True, timeout=CHILD_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise ScenarioError(
            f"chaos fault 'restart': the restart command ran past {CHILD_TIMEOUT:.0f} s"
        ) from None
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise ScenarioError(
            f"chaos fault 'restart': the restart command exited {done.returncode}: {tail}"
        )


def _durable_snapshot(scenario: Scenario[Any], directory: Path) -> CrashSnapshot:
    """What the judge must know of a store restart, read once the server is back while
    the worker may already be recovering: the decisions recorded in the journal's prefix
    the witness had seen (durable before the crash: the witness advances only after an
    output point's synchronous commit), which must never be asked again; and the model
    calls so far, read last, so every decision asked before the crash is counted and
    one whose record was not durable may be asked once more (the crash may have lost
    it, as designed)."""
    run_id = scenario.resolved_run_id
    env = scenario.env_factory(env_dir(directory))
    try:
        with open_ledger(directory) as ledger:
            info = read_run(ledger, run_id)  # None: the run's start was lost too
            witness = ledger.witness
            durable = (witness.get(run_id) if witness is not None else None) or 0
            events = ledger.journal(run_id, results=False)[:durable] if info else []
            done = {e.key for e in events if e.type is EventType.STEP_DONE}
            recorded = recorded_decisions(info) & done
        calls = scenario.model_calls(env) if scenario.model_calls else {}
    finally:
        close_env(env)
    return CrashSnapshot(calls={k: int(v) for k, v in calls.items()}, recorded=recorded)


def _while_a_worker_drives(
    target: str, directory: Path, delay: float, fault: Callable[[], None]
) -> tuple[bool, str | None]:
    """One worker drives the run; ``fault`` runs ``delay`` seconds after it opens the
    ledger, unless the worker ended first. Returns (it ended first, why the worker did
    not finish the run by itself, or None)."""
    with _started(target, directory, worker=True) as child:
        running = _wait_running(child, directory)
        early = False
        try:
            left = delay if running is None else delay - (time.monotonic() - running)
            child.wait(timeout=max(left, 0.0))
            early = True  # it ended before the fault
        except subprocess.TimeoutExpired:
            fault()
        try:
            code = child.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:  # killed on the way out (_started)
            return early, f"the worker did not finish the run in {CHILD_TIMEOUT:.0f} s"
    return early, _unfinished(code)


def _last_worker(target: str, directory: Path) -> str | None:
    """A worker, not killed, after the killed ones: it must finish the run by itself."""
    with _started(target, directory, worker=True) as child:
        try:
            code = child.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:  # killed on the way out (_started)
            return f"the last worker did not finish the run in {CHILD_TIMEOUT:.0f} s"
    return _unfinished(code)


def _journaled(scenario: Scenario[Any], directory: Path) -> dict[str, int]:
    """``outage_stops``: the run's stops for a service out (each then resumed, when the
    trial is SAME); ``taken_over``: claims of the run from a dead worker's lease;
    ``drives``: the drives that recorded a session (more than one: the run was driven
    again after a fault stopped a drive)."""
    with open_ledger(directory) as ledger:
        events = ledger.journal(scenario.resolved_run_id, results=False)
    stops = sum(
        1
        for e in events
        if e.type is EventType.RUN_STOPPED
        and str(payloads.run_stopped(e).get("reason", "")).startswith(RETRYABLE_PREFIX)
    )
    sessions = [e.payload.get("session") for e in events if isinstance(e.payload, dict)]
    taken = sum(
        1
        for s in sessions
        if isinstance(s, dict) and (s.get("lease") or {}).get("decision") == "expired"
    )
    drives = sum(1 for s in sessions if isinstance(s, dict))
    return {"outage_stops": stops, "taken_over": taken, "drives": drives}


def _ledger_files(directory: Path) -> dict[str, bytes]:
    """The content of the trial's ledger and witness files (``-shm`` aside: an index)."""
    found = {}
    for path in sorted(directory.glob("ledger.db*")):
        if path.is_file() and not path.name.endswith("-shm"):
            found[path.name] = path.read_bytes()
    return found


def _unfinished(code: int) -> str | None:
    if code == 0:
        return None
    why = "it waits for a person" if code == 3 else f"the worker exited {code}"
    return f"the workers did not finish the run by themselves ({why}; see child.log)"


def _command(target: str, directory: Path, worker: bool, powercut: bool) -> list[str]:
    # N = 0: no crash point armed, the child runs (or resumes) the scenario to its end.
    command = [sys.executable, "-m", "crashproof.verify._child", target, str(directory), "0"]
    return command + ["--worker"] * worker + ["--powercut"] * powercut


def _start(
    target: str, directory: Path, log: IO[bytes], worker: bool = False, powercut: bool = False
) -> subprocess.Popen[bytes]:
    (directory / RUNNING).unlink(missing_ok=True)
    return subprocess.Popen(
        _command(target, directory, worker, powercut),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=child_env(),
        start_new_session=True,  # its own group: the kill takes git and test runners too
    )


@contextlib.contextmanager
def _started(
    target: str, directory: Path, worker: bool = False, powercut: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """``_start`` with its log, and the child's process group SIGKILLed if it is still
    there when the block ends: a verifier interrupted mid-trial (Ctrl-C, a test's time
    limit) leaves no worker serving on, against a store nobody restarts any more."""
    with open(directory / "child.log", "ab") as log:
        child = _start(target, directory, log, worker, powercut)
        try:
            yield child
        finally:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()


def _wait_running(child: subprocess.Popen[bytes], directory: Path) -> float | None:
    """The monotonic time the child signalled it opens the ledger; None if it ended first."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while not (directory / RUNNING).exists():
        if child.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.002)
    return time.monotonic()


def _run_and_kill(
    target: str, directory: Path, delay: float, worker: bool = False, powercut: bool = False
) -> tuple[bool, bool]:
    """Start a child (``worker``: one driving the run as a worker; ``powercut``: one
    keeping the ledger's durable state) in a new process group; SIGKILL the group
    ``delay`` seconds after it starts opening the ledger. Returns (killed, whether a
    process the child started was running then)."""
    with _started(target, directory, worker, powercut) as child:
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
