"""What proving recovery costs: a crash trial against an uninterrupted run, per scenario.

For the patch task (8 decisions + 8 workspace appends) and the code agent (git, HTTP forge)
of ``examples/``, measured in one process on one disk, printed side by side:

- **run**: one uninterrupted ``ledger.run`` on a fresh ledger (opening and closing it
  included) in a prepared environment; one is measured beside every trial;
- **crash trial (in-process)**: a run that crashes at crash point n (a SimulatedCrash),
  then a new Ledger object on the same file that resumes it to the end: the work a crash
  costs, averaged over every crash point n. Goal: <= 1.5x a run;
- **verifier case, in-process / subprocess**: what ``crashproof verify`` spends per crash
  point, environment, history check and redelivery included (subprocess: a child process
  started, killed by SIGKILL, then the resume here);
- **crash points/s**: cases per second of a whole ``verify`` run, both modes;
- **two recoverers / stale checkpoint**: what one case of each new kind costs (a race of
  two recoverers, a take-over that fences one out, a stale checkpoint exported, the run
  finished, imported three ways and resumed), per mode, with its verdicts.

All ledgers use durability "normal", as the verifier's do (a process crash keeps what the
OS holds; see ``crashproof.verify.trial_kit.DURABILITY``).

Usage: python bench/verify.py [--repeats 3] [--subprocess-points 10] [--contention-points 4]
[--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common as common

import crashproof as cp
from crashproof.verify import CaseKind, Scenario, verify
from crashproof.verify.scenario import close_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/
from examples import code_agent, patch_task


def _ledger(directory: Path, points: cp.CrashPoints | None = None) -> cp.Ledger:
    url = f"sqlite:///{(directory / 'ledger.db').resolve()}"
    return cp.Ledger(url, durability="normal", crash_points=points)


def _run(scenario: Scenario[Any], ledger: cp.Ledger, env: Any) -> Any:
    wf = scenario.workflow_factory(env)
    return ledger.run(wf, run_id=scenario.resolved_run_id, **scenario.inputs)


def uninterrupted(scenario: Scenario[Any], directory: Path) -> tuple[float, int]:
    """Seconds of one run (ledger open to close) and the crash points it passed."""
    directory.mkdir(parents=True)
    env = scenario.env_factory(directory)
    try:
        points = cp.CrashPoints()
        start = time.perf_counter()
        with _ledger(directory, points) as ledger:
            _run(scenario, ledger, env)
        return time.perf_counter() - start, len(points.passed)
    finally:
        close_env(env)


def crash_trial(scenario: Scenario[Any], directory: Path, at: int) -> float:
    """Seconds of a run crashed at point ``at`` plus its resume by a new Ledger object."""
    directory.mkdir(parents=True)
    env = scenario.env_factory(directory)
    try:
        start = time.perf_counter()
        crashing = _ledger(directory, cp.CrashPoints(at=at))
        with crashing as ledger, contextlib.suppress(cp.SimulatedCrash):
            _run(scenario, ledger, env)
        with _ledger(directory) as ledger:
            _run(scenario, ledger, env)
        return time.perf_counter() - start
    finally:
        close_env(env)


def measure(
    name: str, scenario: Scenario[Any], target: str, root: Path, repeats: int, sub_points: int
) -> list[str]:
    runs, trials = [], []
    _, n_points = uninterrupted(scenario, root / f"{name}-warm-up")
    for r in range(repeats):
        # Interleaved, one run beside each trial, so that load shifts hit both alike.
        pairs = [
            (
                uninterrupted(scenario, root / f"{name}-run-{r}-{n}")[0],
                crash_trial(scenario, root / f"{name}-trial-{r}-{n}", n),
            )
            for n in range(1, n_points + 1)
        ]
        runs.append(statistics.mean(run for run, _ in pairs))
        trials.append(statistics.mean(trial for _, trial in pairs))
    run, trial = common.median(runs), common.median(trials)
    # Crash trials only: the contention cases (on by default) are measured below.
    inproc = verify(
        scenario, mode="inproc", seed=0, recovery_points=0, contention_points=0, workdir=root
    )
    sub = verify(
        scenario,
        mode="subprocess",
        seed=0,
        max_points=sub_points,
        recovery_points=0,
        contention_points=0,
        target=target,
        workdir=root,
    )
    case_in = statistics.mean(r.seconds for r in inproc.results[2:])
    case_sub = statistics.mean(r.seconds for r in sub.results[2:])
    if not (inproc.ok and sub.ok):
        raise SystemExit(f"{name}: the verifier found a divergence; not a benchmark")
    return [
        name,
        str(n_points),
        f"{run * 1000:.1f}",
        f"{trial * 1000:.1f} ({trial / run:.2f}x)",
        f"{case_in * 1000:.1f} ({case_in / run:.2f}x)",
        f"{case_sub * 1000:.0f} ({case_sub / run:.1f}x)",
        f"{(len(inproc.results) - 2) / inproc.seconds:.1f}",
        f"{(len(sub.results) - 2) / sub.seconds:.2f}",
    ]


def contention(
    name: str, scenario: Scenario[Any], target: str, root: Path, points: int, run: float
) -> list[list[str]]:
    """One row per mode: mean seconds of a race, a take-over and a stale-checkpoint case."""
    rows = []
    for mode, n in (("inproc", points), ("subprocess", max(1, points // 2))):
        report = verify(
            scenario,
            mode=mode,  # type: ignore[arg-type]
            seed=0,
            max_points=2 * n,
            recovery_points=0,
            contention_points=n,
            target=target,
            workdir=root,
        )
        two = report.of_kind(CaseKind.TWO_RECOVERERS)
        kinds = {
            "race": [r for r in two if r.case.variant == "race"],
            "take-over": [r for r in two if r.case.variant == "take-over"],
            "stale": report.of_kind(CaseKind.STALE_CHECKPOINT),
        }
        row = [name, mode, str(n)]
        for cases in kinds.values():
            mean = statistics.mean(r.seconds for r in cases)
            row.append(f"{mean * 1000:.0f} ({mean / run:.1f}x)")
        verdicts = " ".join(
            f"{kind}:{''.join(sorted(r.verdict.value[0] for r in cases))}"
            for kind, cases in kinds.items()
        )
        rows.append([*row, verdicts])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repetitions, median kept (3)")
    parser.add_argument(
        "--subprocess-points", type=int, default=10, help="crash points tried in subprocess (10)"
    )
    parser.add_argument(
        "--contention-points",
        type=int,
        default=4,
        help="crash points given two recoverers and a stale checkpoint (4; half in subprocess)",
    )
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    args = parser.parse_args(argv)
    directory = common.make_tempdir(args.dir)
    try:
        print("crashproof bench: the cost of a crash trial against an uninterrupted run")
        common.print_facts(common.machine_facts(directory))
        rows = [
            measure(
                "patch-task",
                patch_task.SCENARIO,
                "examples.patch_task:SCENARIO",
                directory,
                args.repeats,
                args.subprocess_points,
            ),
            measure(
                "code-agent",
                code_agent.SCENARIO,
                "examples.code_agent:SCENARIO",
                directory,
                args.repeats,
                args.subprocess_points,
            ),
        ]
        print()
        common.print_table(
            [
                "scenario",
                "crash points",
                "run ms",
                "crash+resume ms",
                "verify case ms (inproc)",
                "verify case ms (subprocess)",
                "points/s inproc",
                "points/s subprocess",
            ],
            rows,
        )
        extra = []
        for name, scenario, target, row in (
            ("patch-task", patch_task.SCENARIO, "examples.patch_task:SCENARIO", rows[0]),
            ("code-agent", code_agent.SCENARIO, "examples.code_agent:SCENARIO", rows[1]),
        ):
            run = float(row[2]) / 1000
            extra += contention(name, scenario, target, directory, args.contention_points, run)
        print()
        common.print_table(
            [
                "scenario",
                "mode",
                "points",
                "race ms",
                "take-over ms",
                "stale checkpoint ms",
                "verdicts (S/R/D)",
            ],
            extra,
        )
        print(
            "\ncrash+resume: averaged over every crash point (goal <= 1.5x a run); a verify case"
            "\nadds a fresh environment, the history check and a redelivery; load average now:"
            f" {common.load_average()}"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    with common.exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
