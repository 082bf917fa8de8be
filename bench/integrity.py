"""What the HMAC chain and the generation witness cost.

Side by side, in one run, on the same disk: steps/s of a ledger that seals every record
and mirrors generations in its witness (the default) against the same ledger without
either (a bare SQLiteStore), with the ratio (goal >= 0.9); the sealed ledger once with
the native seal (integrity/_seal.c, where built) and once computing the same MACs in
Python (the fallback of an install without it); then `Ledger.check` speed in records
verified per second.

Usage: python bench/integrity.py [--steps 2000] [--repeats 11] [--check-steps 20000]
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import _common as common

import crashproof as cp
from crashproof.integrity import seal
from crashproof.integrity.keys import Keyring
from crashproof.runtime.driving.urls import default_witness
from crashproof.store.sqlite import SQLiteStore

KEY = "42" * 32


def open_ledger(path: Path, durability: str, *, sealed: bool, native: bool = True) -> cp.Ledger:
    """The default sealed ledger (chain + witness), the same with the Python seal
    (``native=False``), or a bare SQLiteStore (``sealed=False``)."""
    url = f"sqlite:///{path}"
    if sealed and native:
        return cp.Ledger(url, key=KEY, durability=durability)
    if sealed:  # what Ledger(url, key=KEY) opens, with the Python seal
        sealer = seal.Sealer(Keyring.from_hex(KEY), native=False)
        store = SQLiteStore(path, durability=durability, sealer=sealer)
        return cp.Ledger(url, store=store, witness=default_witness(url, store))
    return cp.Ledger(url, store=SQLiteStore(path, durability=durability))


def run_steps(
    directory: Path,
    n: int,
    tag: str,
    *,
    sealed: bool,
    durability: str = "full",
    cpu: list[float] | None = None,
    native: bool = True,
) -> float:
    """Steps/s of wall time; ``cpu`` gets steps per CPU second of this process (user +
    system), which a busy neighbour on the machine does not slow down."""
    path = directory / f"integrity-{tag}.db"
    ledger = open_ledger(path, durability, sealed=sealed, native=native)
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


def check_speed(directory: Path, n: int, *, native: bool = True) -> float:
    """Records/s of ``Ledger.check`` over one run of ``n`` steps."""
    path = directory / f"check-{native}.db"
    ledger = open_ledger(path, "normal", sealed=True, native=native)
    ledger.run(common.make_workflow(ledger), run_id="bench:check", n=n)
    start = time.perf_counter()
    report = ledger.check()
    elapsed = time.perf_counter() - start
    ledger.close()
    common.remove_db(path)
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
        facts = common.machine_facts(directory)
        facts.append(("native seal", "built" if seal.NATIVE else "not built (Python only)"))
        common.print_facts(facts)
        rows = []
        # (sealed, native) of each side; without the native module "sealed" is the
        # Python seal already
        sides = {"plain": (False, False), "sealed": (True, True), "python": (True, False)}
        if not seal.NATIVE:
            del sides["python"]
        for durability in ("output", "full", "normal"):  # output: the default
            cpu: dict[str, list[float]] = {name: [] for name in sides}

            def measure(
                name: str, durability: str = durability, cpu: dict[str, list[float]] = cpu
            ) -> Callable[[str], float]:
                sealed, native = sides[name]
                return lambda tag: run_steps(
                    directory,
                    args.steps,
                    f"{durability}-{tag}",
                    sealed=sealed,
                    durability=durability,
                    cpu=cpu[name],
                    native=native,
                )

            measures = {name: measure(name) for name in sides}
            results = common.interleaved(args.repeats, measures)
            plain = common.median(results["plain"])
            rows.append([f"{durability}: no chain, no witness", common.fmt_rate(plain), "", ""])
            for side, label in (("sealed", "chain + witness"), ("python", "the same, Python seal")):
                if side not in results:
                    continue
                ratios = common.round_ratios(results[side], results["plain"])
                cpu_ratios = common.round_ratios(cpu[side], cpu["plain"])
                rows.append(
                    [
                        f"{durability}: {label}",
                        common.fmt_rate(common.median(results[side])),
                        f"{common.median(ratios):.2f}",
                        " ".join(f"{r:.2f}" for r in sorted(ratios)),
                    ]
                )
                rows.append(
                    [
                        f"{durability}: {label}, per CPU second",
                        "",
                        f"{common.median(cpu_ratios):.2f}",
                        " ".join(f"{r:.2f}" for r in sorted(cpu_ratios)),
                    ]
                )
        checks = [("check (records verified)", True)]
        if seal.NATIVE:
            checks.append(("check, Python seal", False))
        for label, native in checks:
            rate = check_speed(directory, args.check_steps, native=native)
            rows.append([label, common.fmt_rate(rate), "", ""])
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
    with common.exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
