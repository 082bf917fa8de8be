"""crashproof against the raw SQLite commit limit, on one disk, in one process.

    .venv/bin/python bench/steps.py [--steps 2000] [--replay-steps 20000] [--repeats 5]
                                    [--dir /tmp] [--profile]

(a) raw SQLite: N single-row ``BEGIN IMMEDIATE; INSERT; COMMIT`` transactions, WAL,
    synchronous=FULL -> commits/s (and synchronous=NORMAL for the second line);
(b) crashproof: a workflow of N ``ctx.step`` calls on ``sqlite:////abs/path.db`` with
    durability "full" (and "normal") -> steps/s, and the ratio to (a);
(c) replay: a run with R recorded steps that crashed just before ``run_succeeded`` is
    resumed by a new Ledger; nothing runs again -> recorded steps replayed/s.

Each measurement is repeated (interleaved a/b/a/b) and the median is reported. Every
database lives in one fresh temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import time
from pathlib import Path

from _common import (
    crashproof_steps,
    exit_on_sigterm,
    fmt_rate,
    fmt_runs,
    interleaved,
    load_average,
    machine_facts,
    make_tempdir,
    make_workflow,
    median,
    print_facts,
    print_table,
    raw_commits,
)

import crashproof as cp
from crashproof.store.sqlite import SQLiteStore

REPLAY_RUN = "bench:replay"


def build_crashed_run(path: Path, steps: int) -> float:
    """Record ``steps`` steps in a run that crashes just before its run_succeeded commit.
    Returns the seconds it took (durability "normal": building is not what we measure)."""
    crash = cp.CrashPoints(match="before_commit[run_succeeded]")
    ledger = cp.Ledger(f"sqlite:///{path}", durability="normal", crash_points=crash)
    start = time.perf_counter()
    try:
        ledger.run(make_workflow(ledger), run_id=REPLAY_RUN, n=steps)
    except cp.SimulatedCrash:
        pass
    else:
        raise RuntimeError("the crash point did not fire; the run completed")
    finally:
        ledger.close()
    return time.perf_counter() - start


def resume_once(
    path: Path, steps: int, profile: cProfile.Profile | None = None, *, sealed: bool = True
) -> float:
    """Resume the crashed run with a new Ledger (durability "full"); seconds taken.
    ``sealed=False`` opens the file through a bare store: no MAC verification, no
    witness (what replay costs without the integrity layer)."""
    if sealed:
        ledger = cp.Ledger(f"sqlite:///{path}")
    else:
        ledger = cp.Ledger(f"sqlite:///{path}", store=SQLiteStore(path))
    try:
        make_workflow(ledger)
        start = time.perf_counter()
        if profile is not None:
            profile.enable()
        result = ledger.resume(REPLAY_RUN)
        if profile is not None:
            profile.disable()
        elapsed = time.perf_counter() - start
        info = ledger.get_run(REPLAY_RUN)
    finally:
        ledger.close()
    assert result == steps, result
    assert info.status is cp.RunStatus.SUCCEEDED, info.status
    assert len(info.steps) == steps, len(info.steps)
    return elapsed


def measure_replay(directory: Path, steps: int, repeats: int, profile: bool) -> None:
    source = directory / "replay-source.db"
    built = build_crashed_run(source, steps)
    print(f"built a crashed run of {steps:,} recorded steps in {built:.1f} s (durability normal)")
    rates, bare_rates = [], []
    for r in range(repeats + (1 if profile else 0)):
        copy = directory / f"replay-{r}.db"
        shutil.copyfile(source, copy)  # closed cleanly: the WAL is checkpointed into the file
        # ... and its generation witness, which a ledger without it refuses to resume.
        shutil.copyfile(f"{source}.witness", f"{copy}.witness")
        if r == repeats:
            prof = cProfile.Profile()
            elapsed = resume_once(copy, steps, prof)
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(10)
            print(f"\ncProfile of one resume ({elapsed:.3f} s under the profiler), top 10 by")
            print("cumulative time:")
            print(_trim_profile(out.getvalue()))
        else:
            rates.append(steps / resume_once(copy, steps))
            bare = directory / f"replay-bare-{r}.db"
            shutil.copyfile(source, bare)
            bare_rates.append(steps / resume_once(bare, steps, sealed=False))
    print()
    print_table(
        ["measurement", "runs", "median", "goal"],
        [
            [
                f"replay {steps:,} recorded steps (new Ledger, resume)",
                fmt_runs(rates),
                f"{fmt_rate(median(rates))} steps/s",
                ">= 50,000 steps/s",
            ],
            [
                "  the same without MAC verification and witness",
                fmt_runs(bare_rates),
                f"{fmt_rate(median(bare_rates))} steps/s",
                "",
            ],
        ],
    )


def _trim_profile(text: str) -> str:
    lines = text.strip().splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("ncalls"):
            return "\n".join(lines[i:])
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="N commits / steps (2000)")
    parser.add_argument("--replay-steps", type=int, default=20000, help="recorded steps (20000)")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions, median kept (5)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    parser.add_argument("--profile", action="store_true", help="cProfile one replay")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)

    directory = make_tempdir(args.dir)
    try:
        print("crashproof steps benchmark")
        print_facts(machine_facts(directory))
        n = args.steps
        print(f"\nN = {n:,} per measurement, {args.repeats} interleaved repeats, median kept\n")
        rows = []
        for sync, durability in (("FULL", "full"), ("NORMAL", "normal")):
            got = interleaved(
                args.repeats,
                {
                    "raw": lambda tag, s=sync: raw_commits(directory, n, s, tag),
                    "cp": lambda tag, d=durability: crashproof_steps(directory, n, d, tag),
                },
            )
            raw, steps = median(got["raw"]), median(got["cp"])
            rows.append(
                [
                    f"raw SQLite commits/s (WAL, synchronous={sync})",
                    fmt_runs(got["raw"]),
                    fmt_rate(raw),
                    "",
                ]
            )
            rows.append(
                [
                    f"crashproof steps/s (durability={durability})",
                    fmt_runs(got["cp"]),
                    fmt_rate(steps),
                    f"{steps / raw:.2f}" + (" (goal >= 0.5)" if durability == "full" else ""),
                ]
            )
        print_table(["measurement", "runs", "median", "ratio steps/commits"], rows)
        print()
        measure_replay(directory, args.replay_steps, args.repeats, args.profile)
        print(f"\nload avg at end: {load_average()}")
    finally:
        if args.keep:
            print(f"\nkept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    with exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
