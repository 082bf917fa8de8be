"""Group commit on PostgreSQL: 8 runs driving ``ctx.act`` (no-op tool) in threads of one
process vs 1 run, ``output`` durability, sealed (the default Ledger).

    .venv/bin/python bench/pg_group.py [--acts 150] [--runs 8] [--repeats 3]

Starts its own throwaway PostgreSQL server (tests/postgres_server.py: initdb + pg_ctl on
127.0.0.1, fsync on) and a fresh database per measurement. The runs share one Ledger whose
pool has a connection per run (``?pool_size=``); every run makes ``--acts`` acts. Prints
acts/s, the ratio, and the client's CPU per act (this process, all threads): the server
shares the same machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import concurrent_acts, exit_on_sigterm, fmt_rate, machine_facts, median, print_facts

import crashproof as cp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from postgres_server import PostgresServer, find_bindir


def acts(url: str, n: int, runs: int) -> tuple[float, float]:
    """Acts/s of ``runs`` concurrent runs of ``n`` acts on one Ledger, and this process's
    CPU per act in microseconds."""
    ledger = cp.Ledger(url, durability="output", key="42" * 32)
    try:
        rate, cpu_us, _switches = concurrent_acts(ledger, n, runs, "pg")
    finally:
        ledger.close()
    return rate, cpu_us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acts", type=int, default=150, help="acts per run (150)")
    parser.add_argument("--runs", type=int, default=8, help="concurrent runs (8)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, median kept (3)")
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries (initdb, pg_ctl) not found")
    server = PostgresServer(bindir)
    server.start()
    try:
        version = server.query(server.url("postgres"), "SHOW server_version")[0][0]
        print("crashproof bench: group commit on PostgreSQL")
        print_facts([*machine_facts(Path.cwd()), ("postgresql", f"{version} ({bindir})")])
        one: list[float] = []
        many: list[float] = []
        cpu_one: list[float] = []
        cpu_many: list[float] = []
        for _ in range(args.repeats):
            rate, cpu = acts(server.create_database(), args.acts, 1)
            one.append(rate)
            cpu_one.append(cpu)
            url = f"{server.create_database()}?pool_size={args.runs}"
            rate, cpu = acts(url, args.acts, args.runs)
            many.append(rate)
            cpu_many.append(cpu)
        ratios = [m / o for m, o in zip(many, one, strict=True)]
        print()
        print(
            f"1 run:  {fmt_rate(median(one))} acts/s, {median(cpu_one):.0f} us client CPU per act"
        )
        print(
            f"{args.runs} runs: {fmt_rate(median(many))} acts/s, "
            f"{median(cpu_many):.0f} us client CPU per act"
        )
        print(
            f"{args.runs} runs / 1 run = {median(ratios):.2f}x (rounds: "
            f"{' '.join(f'{r:.2f}' for r in ratios)}); the issue's goal >= 4x"
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    with exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
