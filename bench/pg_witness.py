"""The cost of the PostgreSQL witness's durable writes (#38): runs/s with every witness
write committed with ``synchronous_commit`` on (as shipped) against off (as before).

    .venv/bin/python bench/pg_witness.py [--runs 150] [--rounds 8]

Each run makes one act (a no-op tool), so it pays three witness writes: its row, the
act's advance, the outcome's advance. Measured one run at a time and 8 threads at once,
on one Ledger (the default witness: a schema of its own in the ledger's database), on
a throwaway server (tests/postgres_server.py, fsync on), a fresh database each time, the
two settings alternated round by round; the median of the rounds is printed. "off" sets
the module's private constant, for this comparison only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from _common import exit_on_sigterm, machine_facts, print_facts

import crashproof as cp
import crashproof.integrity.pg_witness as pg_witness

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from postgres_server import PostgresServer, find_bindir

SETTINGS = {
    "on": pg_witness._DURABLE,
    "off": "set_config('synchronous_commit', 'off', true) = 'off'",
}


class Noop(cp.Tool):
    name: ClassVar[str] = "noop"
    version: ClassVar[str] = "1"

    def execute(self, call: cp.Call) -> cp.Receipt:
        return cp.Receipt(call.operation_id, {"ok": True}, call.intent_digest)


def rate(url: str, setting: str, runs: int, threads: int) -> float:
    pg_witness._DURABLE = setting  # read by every write statement when it is sent
    tool = Noop()
    with cp.Ledger(url, key="42" * 32) as ledger:

        @ledger.workflow("w", version="1")
        def w(ctx: cp.Context, i: int) -> int:
            ctx.act("a", tool, i=i)
            return i

        def one(i: int) -> Any:
            return ledger.run(w, run_id=f"r{i}", i=i)

        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(runs)))
        return runs / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=150, help="runs per measurement (150)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds, median kept (8)")
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        print("PostgreSQL server binaries not found (see tests/postgres_server.py)")
        return 1
    server = PostgresServer(bindir)
    server.start()
    try:
        print_facts(machine_facts(server.root))
        found: dict[tuple[str, int], list[float]] = {}
        for n in range(args.rounds):
            order = ("on", "off") if n % 2 == 0 else ("off", "on")
            for name in order:
                for threads in (1, 8):
                    got = rate(server.create_database(), SETTINGS[name], args.runs, threads)
                    found.setdefault((name, threads), []).append(got)
        for (name, threads), rates in sorted(found.items()):
            print(
                f"witness synchronous_commit {name:3}  {threads} thread(s)  "
                f"{statistics.median(rates):6.0f} runs/s (median of {len(rates)})"
            )
    finally:
        pg_witness._DURABLE = SETTINGS["on"]
        server.stop()
    return 0


if __name__ == "__main__":
    with exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
