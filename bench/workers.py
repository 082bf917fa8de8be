"""crashproof on PostgreSQL: journaled steps against raw commits, and worker scaling.

    .venv/bin/python bench/workers.py [--steps 1000] [--raw 2000] [--repeats 3]
                                      [--runs 40] [--run-steps 5] [--step-ms 20]

Starts its own throwaway PostgreSQL server (tests/postgres_server.py: initdb + pg_ctl on
127.0.0.1, fsync on), a fresh database per measurement, and removes it at the end.

(a) raw: N single-row ``INSERT`` transactions (autocommit, ``synchronous_commit`` on)
    through one psycopg connection -> commits/s;
(b) crashproof: one run of N ``ctx.step`` calls on ``postgresql://...`` (durability
    "full": every step is one committed transaction) -> steps/s, and the ratio to (a).
    (a) and (b) are interleaved, ``--repeats`` times, median reported.
(c) workers: R runs are enqueued, each S steps that sleep 20 ms (as an agent waits on a
    model); 1, 2 and 4 ``crashproof worker`` processes (one run at a time each) drain the
    queue -> runs completed per second, from the first claim to the last run's end
    (taken from the workers' JSON-lines logs, so process start-up is not counted).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    RAW_PAYLOAD,
    exit_on_sigterm,
    fmt_rate,
    load_average,
    machine_facts,
    median,
    print_facts,
)

import crashproof as cp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the PostgreSQL test server helper

import psycopg  # noqa: E402

from postgres_server import PostgresServer, find_bindir  # noqa: E402

APP = """
import os
import time

import crashproof as cp

STEP_SECONDS = float(os.environ.get("BENCH_STEP_SECONDS", "0.02"))


def wait_on_model(i: int) -> int:
    time.sleep(STEP_SECONDS)
    return i


@cp.workflow("bench-io")
def io_bound(ctx: cp.Context, steps: int) -> int:
    for i in range(steps):
        ctx.step("call", wait_on_model, i)
    return steps
"""


def raw_commits(url: str, n: int) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id bigserial PRIMARY KEY, payload text)")
        conn.execute("SET synchronous_commit TO on")
        start = time.perf_counter()
        for _ in range(n):
            conn.execute("INSERT INTO t (payload) VALUES (%s)", (RAW_PAYLOAD,))
        elapsed = time.perf_counter() - start
    return n / elapsed


def crashproof_steps(url: str, n: int) -> float:
    with cp.Ledger(url, durability="full") as ledger:

        @ledger.workflow("bench-steps")
        def steps(ctx: cp.Context, n: int) -> int:
            for i in range(n):
                ctx.step("step", lambda i=i: {"i": i, "ok": True})
            return n

        start = time.perf_counter()
        result = ledger.run(steps, run_id="bench", n=n)
        elapsed = time.perf_counter() - start
    if result != n:
        raise RuntimeError(f"the run returned {result!r}, not {n}")
    return n / elapsed


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def worker_throughput(
    url: str, workers: int, runs: int, steps: int, app_dir: Path, step_seconds: float
) -> float:
    """Runs/s of ``workers`` worker processes draining ``runs`` enqueued runs."""
    env = {**os.environ, "PYTHONPATH": str(app_dir), "BENCH_STEP_SECONDS": str(step_seconds)}
    logs = [app_dir / f"w{workers}-{i}.log" for i in range(workers)]
    command = [sys.executable, "-m", "crashproof", "worker", "--app", "bench_app", "--db", url]
    options = ["--concurrency", "1", "--poll", "0.05", "--lease", "15"]
    procs = []
    for log in logs:
        with log.open("w") as out:
            procs.append(subprocess.Popen([*command, *options], cwd=app_dir, env=env, stderr=out))
    try:
        _wait(lambda: all(_events(log, "worker_started") for log in logs), "workers to start")
        sys.path.insert(0, str(app_dir))
        import bench_app

        with cp.Ledger(url) as ledger:
            for r in range(runs):
                ledger.enqueue(bench_app.io_bound, run_id=f"io-{workers}-{r}", steps=steps)
            _wait(
                lambda: sum(len(_events(log, "succeeded")) for log in logs) >= runs,
                "the queue to drain",
            )
            statuses = {info.status for info in ledger.runs()}
        if statuses != {cp.RunStatus.SUCCEEDED}:
            raise RuntimeError(f"runs ended as {statuses}")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:  # never left behind
                proc.kill()
                proc.wait()
    claims = [_epoch(e["ts"]) for log in logs for e in _events(log, "claimed")]
    ends = [_epoch(e["ts"]) for log in logs for e in _events(log, "succeeded")]
    if len(ends) != runs:
        raise RuntimeError(f"{len(ends)} runs succeeded, expected {runs}")
    return runs / (max(ends) - min(claims))


def _events(log: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event["event"] == name:
                found.append(event)
    return found


def _wait(predicate: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps in the crashproof run")
    parser.add_argument("--raw", type=int, default=2000, help="raw commits per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=40, help="runs per worker measurement")
    parser.add_argument("--run-steps", type=int, default=5, help="steps per queued run")
    parser.add_argument("--step-ms", type=float, default=20.0, help="each step's wait")
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries (initdb, pg_ctl) not found")
    app_dir = Path(tempfile.mkdtemp(prefix="crashproof-bench-workers-"))
    (app_dir / "bench_app.py").write_text(APP)
    server = PostgresServer(bindir)
    server.start()
    try:
        version = server.query(server.url("postgres"), "SHOW server_version")[0][0]
        print("machine")
        print_facts([*machine_facts(app_dir), ("postgresql", f"{version} ({bindir})")])

        raw: list[float] = []
        steps: list[float] = []
        # Interleaved a/b/a/b, each on a fresh database.
        for _ in range(args.repeats if args.steps else 0):
            raw.append(raw_commits(server.create_database(), args.raw))
            steps.append(crashproof_steps(server.create_database(), args.steps))
        if not steps:
            print("\n(a), (b) skipped (--steps 0)")
        else:
            _print_ab(raw, steps)
        counts = [int(w) for w in args.workers.split(",") if w]
        if not counts:
            return
        rates: dict[int, list[float]] = {w: [] for w in counts}
        for _ in range(max(1, args.repeats - 1)):
            for w in counts:
                url = server.create_database()
                rate = worker_throughput(
                    url, w, args.runs, args.run_steps, app_dir, args.step_ms / 1000
                )
                rates[w].append(rate)
        print(f"\n(c) runs/s, {args.runs} runs x {args.run_steps} steps x {args.step_ms:g} ms wait")
        one = median(rates[counts[0]])
        for w in counts:
            values = " / ".join(f"{v:.1f}" for v in rates[w])
            print(f"    {w} worker(s): {values}   median {median(rates[w]):.1f}", end="")
            print(f"   x{median(rates[w]) / one:.2f}")
        print(f"\nload avg at end: {load_average()}")
    finally:
        server.stop()
        shutil.rmtree(app_dir, ignore_errors=True)


def _print_ab(raw: list[float], steps: list[float]) -> None:
    ratio = median(steps) / median(raw)
    print(f"\n(a) raw single-row commits/s:   {' / '.join(fmt_rate(v) for v in raw)}")
    print(f"    median                       {fmt_rate(median(raw))}")
    print(f"(b) crashproof steps/s:          {' / '.join(fmt_rate(v) for v in steps)}")
    print(f"    median                       {fmt_rate(median(steps))}")
    print(f"    ratio (b)/(a)                {ratio:.2f}   (goal >= 0.5)")


if __name__ == "__main__":
    with exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
