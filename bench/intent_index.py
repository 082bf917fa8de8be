"""What the cross-run index of unresolved act intents costs (#28 item 4, store/intents.py).

Every live act's intent record now opens a hold (one indexed query for holders of the
same digest, one insert) and its receipt releases it (one delete), in the record's own
commit, so both records take the store's checked transaction instead of the one-statement
append. Replay appends nothing and pays nothing. Printed per act, as the median of
``--repeats`` runs of ``--acts`` no-op acts with distinct params (nobody holds them):

- **live**: microseconds per act of a fresh run (intent + receipt commits);
- **replay**: microseconds per act when the same run is driven again (nothing appended);
- **refused**: microseconds for a new run's act that meets another run's hold (the store
  refuses the intent, the run freezes; measured over ``--refusals`` runs).

The numbers of the code before the index come from running this script with
``PYTHONPATH`` on a checkout of that code (it prints ``refused: n/a`` there: without the
index nothing is refused, the act executes again).

Usage: python bench/intent_index.py [--acts 2000] [--repeats 5] [--durability normal]
       [--refusals 200] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

import _common as common

import crashproof as cp


def _ledger(path: Path, durability: str, points: cp.CrashPoints | None = None) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{path}", durability=durability, crash_points=points)


def acts_per_run(directory: Path, n: int, durability: str, tag: str) -> tuple[float, float]:
    """(live, replay) microseconds per act of one run of ``n`` acts."""
    path = directory / f"index-{tag}.db"
    tool = common.NoOp()

    @cp.workflow("bench-index", version="1")
    def acts(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.act("act", tool, i=i)
        return n

    with _ledger(path, durability) as ledger:
        started = time.perf_counter()
        ledger.run(acts, run_id="r", n=n)
        live = time.perf_counter() - started
    with _ledger(path, durability) as ledger:
        ledger.register(acts)
        started = time.perf_counter()
        ledger.run(acts, run_id="r", n=n)
        replay = time.perf_counter() - started
    common.remove_db(path)
    return live / n * 1e6, replay / n * 1e6


def refusals(directory: Path, runs: int, durability: str) -> float | None:
    """Microseconds per new run whose act meets another run's hold (None: not refused)."""
    path = directory / "refusals.db"
    tool = common.NoOp()

    @cp.workflow("bench-held", version="1")
    def held(ctx: cp.Context) -> Any:
        return ctx.act("act", tool, same=True)

    points = cp.CrashPoints(match="before_commit[step_done:act]")
    # The holder: its act left in flight.
    with _ledger(path, durability, points) as crashing, contextlib.suppress(cp.SimulatedCrash):
        crashing.run(held, run_id="holder")
    took = []
    with _ledger(path, durability) as ledger:
        for i in range(runs):
            started = time.perf_counter()
            try:
                ledger.run(held, run_id=f"new-{i}")
            except cp.RunFrozen:
                took.append(time.perf_counter() - started)
            else:
                common.remove_db(path)
                return None
    common.remove_db(path)
    return statistics.median(took) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acts", type=int, default=2000, help="acts per run (2000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs, median kept (5)")
    parser.add_argument("--durability", default="normal", help="normal | output | full")
    parser.add_argument("--refusals", type=int, default=200, help="refused runs (200)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir")
    args = parser.parse_args()
    with common.bench_dir(args.dir) as directory:
        common.print_facts(common.machine_facts(directory))
        results = [
            acts_per_run(directory, args.acts, args.durability, str(i)) for i in range(args.repeats)
        ]
        live = statistics.median(r[0] for r in results)
        replay = statistics.median(r[1] for r in results)
        refused = refusals(directory, args.refusals, args.durability)
        print(f"\n{args.acts:,} acts x {args.repeats}, durability {args.durability}\n")
        refused_text = "n/a" if refused is None else f"{refused:.0f}"
        common.print_table(
            ["per act", "median us", "runs"],
            [
                ["live", f"{live:.0f}", " / ".join(f"{r[0]:.0f}" for r in results)],
                ["replay", f"{replay:.1f}", " / ".join(f"{r[1]:.1f}" for r in results)],
                ["refused (a new run meets a hold)", refused_text, "median"],
            ],
        )
    print(f"\nload avg at end: {common.load_average()}")


if __name__ == "__main__":
    main()
