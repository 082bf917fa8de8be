"""User-space instructions per call, counted by callgrind: a measure that repeats.

Wall-clock rates on a shared VM move by +-25 % between runs, which hides changes of
5-10 %. Instruction counts (``valgrind --tool=callgrind``) repeat to within about 0.5 %,
so they show what a change to the runtime's own code did. They leave out the kernel
(SQLite's locks and WAL writes, fsync), so they complement the rate benchmarks and do
not replace them.

Each figure is the difference between a child process making N calls and one making a
single call, divided by N - 1: start-up, imports and ledger creation cancel out.

    .venv/bin/python bench/instructions.py [--calls 1000] [--replay 5000] [--only NAME]

Needs ``valgrind`` on PATH. Measures: live ``ctx.step``, ``ctx.decide`` and ``ctx.act``
(no-op tool) in ``output`` durability; ``ctx.step`` on a bare store (no MAC, no
witness); and one replayed recorded step (a resume of a crashed run).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common as common

import crashproof as cp

_COLLECTED = re.compile(r"Collected : (\d+)")


def _work(i: int) -> dict[str, Any]:
    return {"i": i, "ok": True}


def _answer(i: int) -> cp.Decision:
    return cp.Decision({"i": i}, model="stub")


def _register(ledger: cp.Ledger, kind: str) -> cp.Workflow[int]:
    tool = common.NoOp()

    @ledger.workflow("bench-instructions", version="1")
    def flow(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            if kind == "act":
                ctx.act("act", tool, i=i)
            elif kind == "decide":
                ctx.decide("plan", _answer, i)
            else:
                ctx.step("step", _work, i)
        return n

    return flow


def _child(kind: str, directory: Path, n: int) -> None:
    """What runs under callgrind (``--child``)."""
    path = directory / "ledger.db"
    if kind == "replay":  # resume a copy of the crashed run built beforehand
        for name in glob.glob(f"{directory}/built.db*"):
            shutil.copy(name, name.replace("built.db", "ledger.db"))
        ledger = cp.Ledger(f"sqlite:///{path}", durability="normal")
        _register(ledger, "step")
        # take_over: the parent that built (and crashed) the run is alive and its lease
        # unexpired, so a plain resume would meet LeaseHeld; the cost is the same for the
        # 1-call and the N-call child, and cancels out.
        ledger.resume("bench", take_over=True)
    else:
        store = None
        if kind == "bare-step":
            from crashproof.store.sqlite import SQLiteStore

            store = SQLiteStore(path, durability="output")
        ledger = cp.Ledger(f"sqlite:///{path}", durability="output", store=store)
        ledger.run(_register(ledger, kind.removeprefix("bare-")), run_id="bench", n=n)
    ledger.close()


def _build_crashed(directory: Path, n: int) -> None:
    crash = cp.CrashPoints(match="before_commit[run_succeeded]")
    ledger = cp.Ledger(
        f"sqlite:///{directory / 'built.db'}", durability="normal", crash_points=crash
    )
    try:
        ledger.run(_register(ledger, "step"), run_id="bench", n=n)
    except cp.SimulatedCrash:
        pass
    finally:
        ledger.close()


def _instructions(kind: str, n: int) -> int:
    directory = Path(tempfile.mkdtemp(prefix="crashproof-instr-"))
    try:
        if kind == "replay":
            _build_crashed(directory, n)
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                __file__,
                "--child",
                kind,
                str(directory),
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    found = _COLLECTED.search(out.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no total:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="live calls per run (1000)")
    parser.add_argument("--replay", type=int, default=5000, help="recorded steps (5000)")
    parser.add_argument("--only", default=None, help="one of step, decide, act, bare-step, replay")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "DIR", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, directory, n = args.child
        _child(kind, Path(directory), int(n))
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("bench/instructions.py needs valgrind on PATH")
    kinds = {"step": args.calls, "decide": args.calls, "act": max(2, args.calls // 3)}
    kinds |= {"bare-step": args.calls, "replay": args.replay}
    if args.only:
        kinds = {args.only: kinds[args.only]}
    print(f"crashproof bench: user-space instructions per call (callgrind), git {_rev()}")
    for kind, n in kinds.items():
        one, many = _instructions(kind, 1), _instructions(kind, n)
        print(f"  {kind:10s} {(many - one) / (n - 1):>10,.0f} per call  (N = {n})", flush=True)
    return 0


def _rev() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=False,
        )
    except OSError:
        return "?"
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    with common.exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
