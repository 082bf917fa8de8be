"""CPU per agent run, pydantic-ai with no durability beside ``CrashproofDurability``:
``bench/frameworks.py``'s agent, ``--concurrency`` runs at once on one event loop, the
process's CPU time (``time.process_time``) per batch divided by its runs. Contestants
are interleaved in each round; the minimum and the median of the rounds are printed.

    .venv/bin/python bench/frameworks_cpu.py [--concurrency 64] [--rounds 7]
        [--model-ms 50] [--turns 10] [--only passthrough,normal] [--profile FILE]

At 32 runs and more every contestant is CPU-bound in one process, so the wall ratio of
``bench/frameworks.py`` is about the ratio of these CPU times; unlike a wall time, CPU
time hardly moves when other processes share the cores (the load average is printed
with each round all the same). ``--profile FILE`` writes a cProfile of the last
crashproof contestant's batches (pstats format) after the rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import LostLeases, bench_dir, load_average
from frameworks import Passthrough, crashproof, plain

Batch = Callable[[int, int], tuple[float, int]]


def cpu_per_run(batch: Batch, i: int, n: int) -> float:
    """Milliseconds of this process's CPU per run for one batch of ``n`` runs."""
    start = time.process_time()
    _, failed = batch(i, n)
    if failed:
        raise SystemExit(f"{failed} runs failed")
    return (time.process_time() - start) * 1000 / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--model-ms", type=float, default=50.0)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--only", default="passthrough,normal", help="passthrough, normal, ...")
    parser.add_argument("--profile", default=None, help="cProfile the last contestant to FILE")
    args = parser.parse_args(argv)

    lost = LostLeases()
    logging.getLogger("crashproof").addHandler(lost)
    closers: list[Callable[[], Any]] = []
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    with bench_dir(None, keep=False, prefix="crashproof-frameworks-cpu-") as directory:
        try:
            batches: dict[str, Batch] = {"plain": plain(args.turns, args.model_ms, directory)[1]}
            for name in only:
                if name == "passthrough":
                    batches[name] = plain(args.turns, args.model_ms, directory, [Passthrough()])[1]
                else:
                    batches[name] = crashproof(
                        args.turns, args.model_ms, directory, name, "step", closers
                    )[1]
            n = args.concurrency
            for batch in batches.values():
                batch(-1, n)  # warm up
            cpu: dict[str, list[float]] = {name: [] for name in batches}
            for i in range(args.rounds):
                load = load_average()
                for name, batch in batches.items():
                    cpu[name].append(cpu_per_run(batch, i, n))
                row = "  ".join(f"{name} {values[-1]:6.2f}" for name, values in cpu.items())
                print(f"round {i + 1}: load {load}; ms CPU/run: {row}", flush=True)
            base = min(cpu["plain"])
            print(f"\n{n} runs at once, {args.turns} turns, {args.model_ms:g} ms model")
            print(f"{'':12} {'min':>7} {'median':>7} {'+min':>7} {'ratio':>7}")
            for name, values in cpu.items():
                low = min(values)
                print(
                    f"{name:12} {low:7.2f} {statistics.median(values):7.2f} "
                    f"{low - base:7.2f} {base / low:7.2f}"
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
