"""Acts per second with a no-op tool, against two raw WAL/FULL commits per act.

An act costs two journal commits (the intent before the effect, the receipt after),
so its natural limit is half the raw single-row commit rate. Printed side by side,
measured in one run on the same disk: raw commits/s, acts/s, and the ratio
acts/s / (raw commits/s / 2) (goal >= 0.5).

Usage: python bench/acts.py [--acts 1000] [--repeats 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import _common as common

import crashproof as cp


def crashproof_acts(directory: Path, n: int, tag: str) -> float:
    path = directory / f"acts-{tag}.db"
    ledger = cp.Ledger(f"sqlite:///{path}")
    tool = common.NoOp()

    @ledger.workflow("bench-acts", version="1")
    def acts(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.act("act", tool, i=i)
        return n

    return common.timed_run(ledger, acts, path, n, tag)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acts", type=int, default=1000, help="acts per run (1000)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions, median kept (3)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    args = parser.parse_args(argv)
    directory = common.make_tempdir(args.dir)
    try:
        print("crashproof bench: acts (intent + receipt commits) vs raw commits")
        common.print_facts(common.machine_facts(directory))
        results = common.interleaved(
            args.repeats,
            {
                "raw": lambda tag: common.raw_commits(directory, 2 * args.acts, "FULL", tag),
                "acts": lambda tag: crashproof_acts(directory, args.acts, tag),
            },
        )
        raw, acts = common.median(results["raw"]), common.median(results["acts"])
        print()
        common.print_table(
            ["measure", "median/s", "runs"],
            [
                ["raw WAL/FULL commits", common.fmt_rate(raw), common.fmt_runs(results["raw"])],
                [
                    "crashproof acts (no-op tool)",
                    common.fmt_rate(acts),
                    common.fmt_runs(results["acts"]),
                ],
            ],
        )
        print(f"\nratio acts/s / (commits/s / 2) = {acts / (raw / 2):.2f}  (goal >= 0.5)")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
