"""``verify``: enumerate the crash points of a scenario, crash at each, resume, compare.

1. One uninterrupted reference run, recording every crash point it passes (each side of
   every journal commit, and the points tools mark inside their effects, such as between
   a workspace's temp file and its rename); then the finished run delivered once more
   (nothing may execute again).
2. For every crash point (or a random sample of ``max_points`` of them, drawn from
   ``random.Random(seed)``): a fresh environment, a run that crashes there, a resume in a
   new Ledger object (or a new process), the history check against the reference, and
   the finished run delivered once more to another new Ledger object.
3. Double crashes: for every crash point tried, a crash again at each of the first
   ``recovery_points`` crash points its recovery passes, then a resume.
4. At ``contention_points`` crash points (sampled with the seed; inproc and subprocess
   modes): two recoverers at once, racing and taking over (``crashproof.verify.contention``),
   and a checkpoint exported there, imported after the run went on
   (``crashproof.verify.stale``).

Chaos mode (``mode="chaos"``) replaces 2-4 with ``trials`` wall-clock kills of the
whole process group at random times, some during recovery too
(``crashproof.verify.chaos``).

The seed is chosen at random when not given, and always recorded in the report: a failure
names it, and the same seed replays the same schedule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from crashproof.verify.chaos import FAULTS, RESTART_ENV, calibrate, chaos_cases
from crashproof.verify.report import (
    DEFAULT_CONTENTION_POINTS,
    Case,
    CaseKind,
    CaseResult,
    Report,
    Verdict,
)
from crashproof.verify.scenario import Scenario, ScenarioError, load_scenario, scenario_target
from crashproof.verify.trial_kit import LEDGER_ENV, Mode
from crashproof.verify.trials import run_case, run_reference

__all__ = [
    "DEFAULT_TRIALS",
    "MODES",
    "Progress",
    "check_store",
    "contention_cases",
    "recovery_candidates",
    "verify",
]

MODES: tuple[Mode, ...] = ("inproc", "subprocess", "powercut", "chaos")
DEFAULT_TRIALS = 20  # chaos mode

_BEFORE_START = "before_commit[run_started]"
_AFTER_START = "after_commit[run_started]"

# progress(done, total, label): called after every case; total grows once the double
# crashes are known.
Progress = Callable[[int, int, str], None]


def verify(
    scenario: Scenario[Any] | str,
    mode: Mode = "inproc",
    seed: int | None = None,
    max_points: int | None = None,
    *,
    recovery_points: int = 3,
    contention_points: int | None = DEFAULT_CONTENTION_POINTS,
    target: str | None = None,
    workdir: Path | None = None,
    workers: int = 1,
    progress: Progress | None = None,
    trials: int = DEFAULT_TRIALS,
    faults: Sequence[str] = ("kill",),
    ledger: str | None = None,
    restart_command: str | None = None,
) -> Report:
    """Crash ``scenario`` at every crash point and compare each resumed run with an
    uninterrupted one; see the module docstring.

    ``scenario``: a Scenario or its ``"MODULE:ATTRIBUTE"``. ``mode``: ``"inproc"`` (a
    simulated crash, a new Ledger object), ``"subprocess"`` (a child process killed by
    SIGKILL; the scenario must be importable, by ``target`` or found as a global of the
    module of its workflow factory) or ``"powercut"`` (a simulated crash of a ledger in
    ``output`` durability, whose files and its witness's then go back to their own last
    sync: every unsynced write is lost, as in a power cut). ``max_points``: at most this
    many crash cases and as many double-crash cases, sampled with ``seed``. ``workers``
    > 1 runs trials in threads (the scenario's factories must then be thread-safe).
    ``contention_points``: at how many crash points (None: all, 0: none) to run the
    two-recoverers and stale-checkpoint cases; in subprocess mode the environment must
    then bear two processes at once. ``workdir``: keep the trial directories of cases
    that did not end SAME there (default: a temporary directory, removed). ``trials``:
    how many wall-clock kill trials chaos mode runs (``"chaos"``: a child process group
    SIGKILLed after a random delay, its recovery too in some trials; the scenario must
    be importable, as for subprocess mode).
    ``faults``: chaos mode's faults, drawn per trial (``kill``, ``worker``: the run driven
    by workers, one killed and the next taking over, ``outage``: the scenario's model
    down longer than its retries, a worker resuming the run by itself, ``powercut``: the
    kill is a power cut, the ledger and its witness back to their last fsync;
    ``crashproof.verify.chaos``; ``restart``: the store crashed and restarted by
    ``restart_command``, a shell command, while a worker drives the run).
    ``ledger``: chaos mode only, a PostgreSQL URL whose database holds the trials'
    ledgers (each trial a schema ``v_<16 hex>`` and its witness ``v_<16 hex>_witness``,
    left there: give it a scratch database); default a SQLite file per trial. Store
    restarts need it; power cuts, which put a SQLite ledger's files back, refuse it.
    """
    if isinstance(scenario, str):
        target = target or scenario
        scenario = load_scenario(scenario)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if max_points is not None and max_points < 1:
        raise ValueError("max_points must be at least 1")
    if recovery_points < 0 or workers < 1:
        raise ValueError("recovery_points must be >= 0 and workers >= 1")
    if contention_points is not None and contention_points < 0:
        raise ValueError("contention_points must be >= 0 (or None: every crash point)")
    target = target or scenario_target(scenario)
    if mode in ("subprocess", "chaos") and target is None:
        raise ScenarioError(
            f"{mode} mode imports scenario {scenario.name!r} in a child process: define it "
            "as a module global and pass its 'MODULE:ATTRIBUTE'"
        )
    if trials < 1:
        raise ValueError("trials must be at least 1")
    unknown = sorted(set(faults) - set(FAULTS))
    if not faults or unknown:
        raise ValueError(f"faults must be some of {', '.join(FAULTS)}, not {list(faults)}")
    check_store(mode, faults, ledger, restart_command)
    if mode == "chaos" and "outage" in faults and scenario.outage is None:
        raise ScenarioError(
            f"chaos fault 'outage': scenario {scenario.name!r} has no outage hook "
            "(Scenario(outage=...): make its model raise cp.Unavailable while down)"
        )
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    started = time.perf_counter()
    with _environment({LEDGER_ENV: ledger, RESTART_ENV: restart_command}), _root(workdir) as root:
        reference, results = run_reference(scenario, root / "reference")
        points = reference.points
        ticker = _Ticker(progress, total=len(results))
        if mode == "chaos" and target is not None:
            span = calibrate(target, root / "calibration")
            cases = chaos_cases(trials, span, rng, faults)
            ticker.grow(len(cases))
            ticker.tick_all(results)  # counted once the total is known: no "2/2" first
            results += _run_all(scenario, reference, cases, root, mode, target, workers, ticker, 1)
            return _report(
                scenario, target, mode, seed, reference, results, started, trials, faults
            )

        singles = [
            Case(kind=CaseKind.CRASH, at=n, point=points[n - 1])
            for n in _sample(range(1, len(points) + 1), max_points, rng)
        ]
        ticker.grow(len(singles))
        ticker.tick_all(results)
        crashed = _run_all(scenario, reference, singles, root, mode, target, workers, ticker, 1)
        results += crashed

        doubles = [
            Case(
                kind=CaseKind.DOUBLE_CRASH,
                at=r.case.at,
                point=r.case.point,
                recovery_at=m,
                recovery_point=r.recovery_points[m - 1],
            )
            for r in crashed
            if r.verdict is not Verdict.DIVERGED
            for m in recovery_candidates(r.recovery_points)[:recovery_points]
        ]
        doubles = [doubles[i] for i in _sample(range(len(doubles)), max_points, rng)]
        ticker.grow(len(doubles))
        start_index = len(singles) + 1
        results += _run_all(
            scenario, reference, doubles, root, mode, target, workers, ticker, start_index
        )
        contended = contention_cases(crashed, contention_points, rng) if mode != "powercut" else []
        ticker.grow(len(contended))
        start_index += len(doubles)
        results += _run_all(
            scenario, reference, contended, root, mode, target, workers, ticker, start_index
        )
    return Report(
        scenario=scenario.name,
        target=target,
        mode=mode,
        seed=seed,
        max_points=max_points,
        recovery_points=recovery_points,
        reference=reference,
        results=tuple(results),
        seconds=time.perf_counter() - started,
        contention_points=contention_points if mode != "powercut" else 0,
    )


def check_store(
    mode: Mode, faults: Sequence[str], ledger: str | None, restart_command: str | None
) -> None:
    """Refuse a store the mode cannot use, and a fault not applicable to the store."""
    if ledger is not None:
        if mode != "chaos":
            raise ValueError(
                "a PostgreSQL ledger is for chaos mode only: the other modes instrument "
                "the files of a SQLite ledger"
            )
        if not ledger.startswith(("postgresql://", "postgres://")) or "schema=" in ledger:
            raise ValueError(
                "the verifier's ledger must be a postgresql:// URL without schema= (each "
                "trial gets a schema of its own)"
            )
        if mode == "chaos" and "powercut" in faults:
            raise ValueError(
                "chaos fault 'powercut' is not applicable to a PostgreSQL ledger: it puts a "
                "SQLite ledger's files back to their last fsync (a server crash: 'restart')"
            )
    if mode == "chaos" and "restart" in faults and (ledger is None or not restart_command):
        raise ValueError(
            "chaos fault 'restart' is not applicable without a PostgreSQL ledger and the "
            "command that restarts its server (the verifier's SQLite ledger has no server; "
            "it restarts none it was not told how to control)"
        )


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set the variables that are not None for the block (the trials' children inherit
    them), then put back what was there."""
    old = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is not None:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _report(
    scenario: Scenario[Any],
    target: str | None,
    mode: Mode,
    seed: int,
    reference: Any,
    results: list[CaseResult],
    started: float,
    trials: int,
    faults: Sequence[str],
) -> Report:
    return Report(
        scenario=scenario.name,
        target=target,
        mode=mode,
        seed=seed,
        max_points=None,
        recovery_points=0,
        reference=reference,
        results=tuple(results),
        seconds=time.perf_counter() - started,
        contention_points=0,
        trials=trials,
        faults=tuple(faults),
    )


def contention_cases(
    crashed: Sequence[CaseResult], limit: int | None, rng: random.Random
) -> list[Case]:
    """At ``limit`` of the crash points tried (sampled with ``rng``) where the run was
    already recorded and the resume did not diverge: two recoverers racing, a take-over at
    a crash point of the recovery (drawn with ``rng``), and a stale checkpoint."""
    usable = [
        r
        for r in crashed
        if r.verdict is not Verdict.DIVERGED
        and r.case.point != _BEFORE_START
        and recovery_candidates(r.recovery_points)
    ]
    cases: list[Case] = []
    for i in _sample(range(len(usable)), limit, rng):
        r = usable[i]
        m = rng.choice(recovery_candidates(r.recovery_points))
        base = Case(kind=CaseKind.TWO_RECOVERERS, at=r.case.at, point=r.case.point)
        cases += [
            dataclasses.replace(base, variant="race"),
            dataclasses.replace(
                base, variant="take-over", recovery_at=m, recovery_point=r.recovery_points[m - 1]
            ),
            dataclasses.replace(base, kind=CaseKind.STALE_CHECKPOINT),
        ]
    return cases


class _Ticker:
    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0

    def grow(self, n: int) -> None:
        self.total += n

    def tick(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)

    def tick_all(self, done: list[CaseResult]) -> None:
        for row in done:
            self.tick(row.case.label)


@contextlib.contextmanager
def _root(workdir: Path | None) -> Iterator[Path]:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix="verify-", dir=workdir))
        return
    with tempfile.TemporaryDirectory(prefix="crashproof-verify-") as tmp:
        yield Path(tmp)


def recovery_candidates(points: Sequence[str]) -> list[int]:
    """1-based indices of the recovery's crash points worth a second crash: all but the
    ``before_commit[run_started]`` a resume passes when its run already exists, where no
    commit follows (a crash there is a crash before the resume began)."""
    return [
        i
        for i, point in enumerate(points, start=1)
        if point != _BEFORE_START or (i < len(points) and points[i] == _AFTER_START)
    ]


def _sample(population: Sequence[int], k: int | None, rng: random.Random) -> list[int]:
    """All of ``population``, or ``k`` of it drawn with ``rng``, in order."""
    if k is None or k >= len(population):
        return list(population)
    return sorted(rng.sample(population, k))


def _run_all(
    scenario: Scenario[Any],
    reference: Any,
    cases: list[Case],
    root: Path,
    mode: Mode,
    target: str | None,
    workers: int,
    ticker: _Ticker,
    first_index: int,
) -> list[CaseResult]:
    def one(index: int, case: Case) -> CaseResult:
        directory = root / f"case-{index:05d}"
        result = run_case(scenario, reference, case, directory, mode=mode, target=target)
        if result.verdict is Verdict.SAME:
            shutil.rmtree(directory, ignore_errors=True)
        return result

    numbered = list(enumerate(cases, start=first_index))
    if workers == 1:
        out = []
        for index, case in numbered:
            out.append(one(index, case))
            ticker.tick(case.label)
        return out
    # Imported here: a child process of subprocess mode imports this module, and never
    # needs threads.
    from concurrent.futures import ThreadPoolExecutor, as_completed

    results: dict[int, CaseResult] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(one, index, case): index for index, case in numbered}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            ticker.tick(result.case.label)
    return [results[index] for index, _ in numbered]
