"""What the HMAC chain and the generation witness cost.

Side by side, in one run, on the same disk: steps/s of a ledger that seals every record
and mirrors generations in its witness (the default) against the same ledger without
either (a bare SQLiteStore), with the ratio (goal >= 0.9); then `Ledger.check` speed in
records verified per second.

Usage: python bench/integrity.py [--steps 2000] [--repeats 11] [--check-steps 20000]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import _common as common

import crashproof as cp
from crashproof.store.sqlite import SQLiteStore

KEY = "42" * 32


def run_steps(
    directory: Path,
    n: int,
    tag: str,
    *,
    sealed: bool,
    durability: str = "full",
    cpu: list[float] | None = None,
) -> float:
    """Steps/s of wall time; ``cpu`` gets steps per CPU second of this process (user +
    system), which a busy neighbour on the machine does not slow down."""
    path = directory / f"integrity-{tag}.db"
    if sealed:
        ledger = cp.Ledger(f"sqlite:///{path}", key=KEY, durability=durability)
    else:
        store = SQLiteStore(path, durability=durability)
        ledger = cp.Ledger(f"sqlite:///{path}", store=store)
    try:
        wf = common.make_workflow(ledger)
        start, start_cpu = time.perf_counter(), time.process_time()
        ledger.run(wf, run_id=f"bench:{tag}", n=n)
        elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
    finally:
        ledger.close()
    common.remove_db(path)
    if cpu is not None:
        cpu.append(n / used)
    return n / elapsed


def check_speed(directory: Path, n: int) -> float:
    path = directory / "check.db"
    ledger = cp.Ledger(f"sqlite:///{path}", key=KEY, durability="normal")
    ledger.run(common.make_workflow(ledger), run_id="bench:check", n=n)
    start = time.perf_counter()
    report = ledger.check()
    elapsed = time.perf_counter() - start
    ledger.close()
    if report != [("bench:check", None)]:
        raise SystemExit(f"check failed: {report}")
    return (n + 2) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per run (2000)")
    parser.add_argument("--repeats", type=int, default=11, help="rounds, median kept (11)")
    parser.add_argument("--check-steps", type=int, default=20000, help="records checked (20000)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    args = parser.parse_args(argv)
    directory = common.make_tempdir(args.dir)
    try:
        print("crashproof bench: integrity (HMAC chain + witness) vs none")
        common.print_facts(common.machine_facts(directory))
        rows = []
        for durability in ("output", "full", "normal"):  # output: the default
            cpu: dict[str, list[float]] = {"plain": [], "sealed": []}
            results = common.interleaved(
                args.repeats,
                {
                    "plain": lambda tag, d=durability, c=cpu: run_steps(
                        directory,
                        args.steps,
                        f"{d}-{tag}",
                        sealed=False,
                        durability=d,
                        cpu=c["plain"],
                    ),
                    "sealed": lambda tag, d=durability, c=cpu: run_steps(
                        directory,
                        args.steps,
                        f"{d}-{tag}",
                        sealed=True,
                        durability=d,
                        cpu=c["sealed"],
                    ),
                },
            )
            plain, sealed = common.median(results["plain"]), common.median(results["sealed"])
            ratios = common.round_ratios(results["sealed"], results["plain"])
            cpu_ratios = common.round_ratios(cpu["sealed"], cpu["plain"])
            rows.append([f"{durability}: no chain, no witness", common.fmt_rate(plain), "", ""])
            rows.append(
                [
                    f"{durability}: chain + witness",
                    common.fmt_rate(sealed),
                    f"{common.median(ratios):.2f}",
                    " ".join(f"{r:.2f}" for r in sorted(ratios)),
                ]
            )
            rows.append(
                [
                    f"{durability}: the same per CPU second",
                    "",
                    f"{common.median(cpu_ratios):.2f}",
                    " ".join(f"{r:.2f}" for r in sorted(cpu_ratios)),
                ]
            )
        rows.append(
            [
                "check (records verified)",
                common.fmt_rate(check_speed(directory, args.check_steps)),
                "",
                "",
            ]
        )
        print()
        common.print_table(["measure", "median/s", "ratio", "ratio per round"], rows)
        print(
            "\nratio: the median of the rounds' ratios (each round runs both, back to back);"
            "\nper CPU second: steps per second of this process's CPU time (user + system),"
            "\nwhich time spent descheduled by other work on the machine does not count"
            "\ngoal: sealed/plain >= 0.9"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
