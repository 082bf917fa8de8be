"""CPU per agent run, pydantic-ai with no durability beside ``CrashproofDurability``:
``bench/frameworks.py``'s agent, ``--concurrency`` runs at once on one event loop, the
process's CPU time (``os.times``: user and kernel, every thread's) per batch divided
by its runs. Contestants are interleaved in each round; the minimum and the median of
the rounds are printed, and the medians of user and kernel time.

    .venv/bin/python bench/frameworks_cpu.py [--concurrency 64] [--rounds 7]
        [--model-ms 50] [--turns 10] [--only passthrough,normal] [--profile FILE]

At 32 runs and more every contestant is CPU-bound in one process, so the wall ratio of
``bench/frameworks.py`` is about the ratio of these CPU times. CPU time moves less than
wall time when other processes share the cores, but it still moves (by 10-20 % between
rounds on a shared 2-core VM): the load average is printed with each round.
``--profile FILE`` writes a cProfile of the last crashproof contestant's batches
(pstats format) after the rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

from _common import LostLeases, bench_dir, load_average
from frameworks import Models, Passthrough, crashproof, plain

Batch = Callable[[int, int], tuple[float, int]]


def cpu_per_run(batch: Batch, i: int, n: int) -> tuple[float, float]:
    """Milliseconds of this process's CPU per run for one batch of ``n`` runs: in user
    space and in the kernel (SQLite's writes and syncs), every thread's."""
    before = os.times()
    _, failed = batch(i, n)
    if failed:
        raise SystemExit(f"{failed} runs failed")
    after = os.times()
    return (after.user - before.user) * 1000 / n, (after.system - before.system) * 1000 / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--model-ms", type=float, default=50.0)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--only", default="passthrough,normal", help="passthrough, normal, ...")
    parser.add_argument("--profile", default=None, help="cProfile the last contestant to FILE")
    parser.add_argument(
        "--model",
        choices=("function", "openai"),
        default="function",
        help="as bench/frameworks.py's (openai: the server's CPU is its child's, not counted)",
    )
    args = parser.parse_args(argv)

    lost = LostLeases()
    logging.getLogger("crashproof").addHandler(lost)
    closers: list[Callable[[], Any]] = []
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    with bench_dir(None, keep=False, prefix="crashproof-frameworks-cpu-") as directory:
        models = Models(args.model, args.turns, args.model_ms)
        closers.append(models.close)
        try:
            batches: dict[str, Batch] = {"plain": plain(args.turns, args.model_ms, models)[1]}
            for name in only:
                if name == "passthrough":
                    batches[name] = plain(args.turns, args.model_ms, models, [Passthrough()])[1]
                else:
                    batches[name] = crashproof(
                        args.turns, args.model_ms, directory, name, "step", models, closers
                    )[1]
            n = args.concurrency
            for batch in batches.values():
                batch(-1, n)  # warm up
            cpu: dict[str, list[float]] = {name: [] for name in batches}
            user: dict[str, list[float]] = {name: [] for name in batches}
            system: dict[str, list[float]] = {name: [] for name in batches}
            for i in range(args.rounds):
                load = load_average()
                for name, batch in batches.items():
                    u, k = cpu_per_run(batch, i, n)
                    user[name].append(u)
                    system[name].append(k)
                    cpu[name].append(u + k)
                row = "  ".join(f"{name} {values[-1]:6.2f}" for name, values in cpu.items())
                print(f"round {i + 1}: load {load}; ms CPU/run: {row}", flush=True)
            base = min(cpu["plain"])
            print(
                f"\n{n} runs at once, {args.turns} turns, {args.model_ms:g} ms {args.model} "
                "model; ms CPU/run"
            )
            heads = ("min", "median", "+min", "ratio", "user", "kernel")
            print(f"{'':12} " + " ".join(f"{h:>7}" for h in heads))
            for name, values in cpu.items():
                low = min(values)
                print(
                    f"{name:12} {low:7.2f} {statistics.median(values):7.2f} "
                    f"{low - base:7.2f} {base / low:7.2f} {statistics.median(user[name]):7.2f} "
                    f"{statistics.median(system[name]):7.2f}"
                )
            print(f"load avg at end: {load_average()}; leases lost: {lost.count}")
            if args.profile:
                name, batch = list(batches.items())[-1]
                profile = cProfile.Profile()
                profile.enable()
                for i in range(3):
                    batch(100 + i, n)
                profile.disable()
                profile.dump_stats(args.profile)
                print(f"profile of {name} (3 batches of {n}): {args.profile}")
        finally:
            for close in closers:
                close()
    return 1 if lost.count else 0


if __name__ == "__main__":
    sys.exit(main())
