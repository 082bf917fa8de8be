"""Output-triggered durability, side by side in one run on one disk.

1. ``ctx.step`` and ``ctx.decide`` in ``output`` durability vs raw SQLite WAL/NORMAL
   commits (no fsync at all): goal ratio >= 0.5.
2. ``ctx.act`` with a no-op tool vs raw WAL/FULL commits (one fsync each): an act is two
   commits but only its intent is forced to disk, so the goal is >= 0.7 of the raw rate.
3. Forced syncs per act, counted by the store (goal 1.0).
4. Group commit: 8 runs driving acts in threads of one process vs 1 run (goal >= 4x
   acts/s): their intents share fdatasyncs. Beside it, the same 8 runs and 1 run in
   ``normal`` durability (never synced): the ceiling group commit can approach, set by
   the CPU (and the GIL) each act needs, and whether threads add acts/s at all. The
   context switches per act (all threads) count the GIL and lock hand-overs.

   Every run in these lines makes the same number of acts (``--group-acts``), so a run's
   fixed cost (its start, its outcome and that outcome's sync) weighs the same per act
   with 1 run as with 8.

Usage: python bench/durability.py [--n 2000] [--acts 500] [--group-acts 250] [--repeats 3]
       [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import _common as common

import crashproof as cp

CONCURRENCY = 8


def _answer(i: int) -> cp.Decision:
    return cp.Decision({"i": i}, model="stub")


def _ledger(directory: Path, tag: str, durability: str = "output") -> tuple[cp.Ledger, Path]:
    path = directory / f"durability-{tag}.db"
    return cp.Ledger(f"sqlite:///{path}", durability=durability), path


def decisions(directory: Path, n: int, tag: str) -> float:
    ledger, path = _ledger(directory, tag)

    @ledger.workflow("bench-decide", version="1")
    def decide(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.decide("plan", _answer, i)
        return n

    return common.timed_run(ledger, decide, path, n, tag)


def acts(
    directory: Path, n: int, tag: str, runs: int = 1, durability: str = "output"
) -> tuple[float, float, float, float]:
    """Acts/s of ``runs`` concurrent runs of ``n`` acts each on one Ledger, the forced
    syncs per act the store counted (the runs' outcomes included), the process's CPU
    time per act (user + system, all threads) in microseconds, and its context switches
    per act."""
    ledger, path = _ledger(directory, tag, durability)
    store: Any = ledger._store
    before = store.syncs
    try:
        rate, cpu_us, switches = common.concurrent_acts(ledger, n, runs, tag)
        syncs = store.syncs - before
    finally:
        ledger.close()
    common.remove_db(path)
    return rate, syncs / (runs * n), cpu_us, switches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="steps/decisions per run (2000)")
    parser.add_argument("--acts", type=int, default=500, help="acts per run (500)")
    parser.add_argument(
        "--group-acts", type=int, default=250, help="acts per run in the group lines (250)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="repetitions, median kept (3)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    args = parser.parse_args(argv)
    directory = common.make_tempdir(args.dir)
    n, m = args.n, args.acts
    per_run = max(1, args.group_acts)
    syncs: dict[str, list[float]] = {"acts": [], "group": []}
    cpu: dict[str, list[float]] = {"one_run": [], "group": [], "group_normal": [], "one_normal": []}
    switches: dict[str, list[float]] = {key: [] for key in cpu}

    def timed_acts(
        key: str, tag: str, count: int, runs: int, durability: str = "output", cpu_key: str = ""
    ) -> float:
        rate, per_act, cpu_us, switched = acts(directory, count, tag, runs, durability)
        if key in syncs:
            syncs[key].append(per_act)
        if cpu_key:
            cpu[cpu_key].append(cpu_us)
            switches[cpu_key].append(switched)
        return rate

    try:
        print("crashproof bench: output-triggered durability vs raw SQLite commits")
        common.print_facts(common.machine_facts(directory))
        results = common.interleaved(
            args.repeats,
            {
                "raw_normal": lambda tag: common.raw_commits(directory, n, "NORMAL", tag),
                "steps": lambda tag: common.crashproof_steps(directory, n, "output", tag),
                "steps_normal": lambda tag: common.crashproof_steps(directory, n, "normal", tag),
                "decide": lambda tag: decisions(directory, n, tag),
                "raw_full": lambda tag: common.raw_commits(directory, m, "FULL", tag),
                "acts": lambda tag: timed_acts("acts", tag, m, 1),
                "one_run": lambda tag: timed_acts("acts", tag, per_run, 1, cpu_key="one_run"),
                "group": lambda tag: timed_acts(
                    "group", tag, per_run, CONCURRENCY, cpu_key="group"
                ),
                "group_normal": lambda tag: timed_acts(
                    "-", tag, per_run, CONCURRENCY, "normal", cpu_key="group_normal"
                ),
                "one_normal": lambda tag: timed_acts(
                    "-", tag, per_run, 1, "normal", cpu_key="one_normal"
                ),
            },
        )
        med = {name: common.median(values) for name, values in results.items()}
        print()
        labels = {
            "raw_normal": "raw WAL/NORMAL commits",
            "steps": "ctx.step (output)",
            "steps_normal": "ctx.step (normal: never synced)",
            "decide": "ctx.decide (output)",
            "raw_full": "raw WAL/FULL commits",
            "acts": "ctx.act, no-op tool (output)",
            "one_run": "ctx.act, 1 run",
            "group": f"ctx.act, {CONCURRENCY} concurrent runs",
            "group_normal": f"ctx.act, {CONCURRENCY} runs, normal (never synced)",
            "one_normal": "ctx.act, 1 run, normal (never synced)",
        }
        common.print_table(
            ["measure", "median/s", "runs"],
            [
                [label, common.fmt_rate(med[name]), common.fmt_runs(results[name])]
                for name, label in labels.items()
            ],
        )
        print()
        print(f"step output / step normal  = {med['steps'] / med['steps_normal']:.2f}  (1.0: free)")

        def versus(name: str, raw: str) -> str:
            """The median of the rounds' ratios (the two sides measured back to back in
            each round), then the ratio of the two medians."""
            rounds = common.round_ratios(results[name], results[raw])
            return f"{common.median(rounds):.2f}  (of the medians: {med[name] / med[raw]:.2f})"

        print(f"step / raw NORMAL commit   = {versus('steps', 'raw_normal')}  goal >= 0.5")
        print(f"decide / raw NORMAL commit = {versus('decide', 'raw_normal')}  goal >= 0.5")
        print(f"act / raw FULL commit      = {versus('acts', 'raw_full')}  goal >= 0.7")
        print(
            f"forced syncs per act       = {common.median(syncs['acts']):.3f}  (goal 1.0; "
            f"the run's outcome adds 1/{m})"
        )
        print(
            f"group commit: {CONCURRENCY} runs / 1 run = {versus('group', 'one_run')}  goal >= 4; "
            f"{common.median(syncs['group']):.3f} forced syncs per act"
        )
        print(
            f"  ceiling without any sync:  {versus('group_normal', 'one_run')}  "
            f"({CONCURRENCY} runs in normal durability / 1 run in output)"
        )
        print(
            f"  threads' own gain:         {versus('group_normal', 'one_normal')}  "
            f"({CONCURRENCY} runs / 1 run, both never synced: > 1 only if threads add acts/s)"
        )
        # Where the time goes: 1 run waits for its sync (wall >> CPU); 8 runs share syncs
        # and are bound by CPU (one GIL, threads handing it over at every SQLite call).
        one_cpu, group_cpu = common.median(cpu["one_run"]), common.median(cpu["group"])
        normal_cpu = common.median(cpu["group_normal"])
        print(
            f"  CPU per act (user+sys, all threads): 1 run {one_cpu:.0f} us of "
            f"{1e6 / med['one_run']:.0f} us wall; {CONCURRENCY} runs {group_cpu:.0f} us "
            f"({normal_cpu:.0f} us never synced; 1 run never synced "
            f"{common.median(cpu['one_normal']):.0f} us)"
        )
        print(
            "  context switches per act (all threads): 1 run "
            f"{common.median(switches['one_run']):.1f}; {CONCURRENCY} runs "
            f"{common.median(switches['group']):.1f} "
            f"({common.median(switches['group_normal']):.1f} never synced; 1 run never synced "
            f"{common.median(switches['one_normal']):.1f})"
        )
        print(
            f"  CPU bound: {1e6 / normal_cpu:.0f} acts/s per core busy = "
            f"{1e6 / normal_cpu / med['one_run']:.2f}x of 1 run per core (4x needs "
            f"{4 * med['one_run']:.0f} acts/s: <= {1e6 / (4 * med['one_run']):.0f} us of wall "
            "per act)"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    with common.exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
