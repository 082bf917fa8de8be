"""Shared pieces of the benchmarks: machine facts, the raw SQLite baseline, the crashproof
workload, and a small table printer. Imported by ``steps.py`` and ``peers.py``."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp

# The benchmarks' ledgers (and the child processes they start) seal with this key unless
# one is set: without it a Ledger would create a key file in the user's config directory.
os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)

# A row about the size of one crashproof step_done event (payload + value).
RAW_PAYLOAD = "x" * 200


class NoOp(cp.Tool):
    """A tool whose effect is free: what is left is the protocol's own cost. Its lookup
    finds every effect (a resume re-reads completed acts' receipts: a lookup that finds
    nothing would freeze the run for review)."""

    name: ClassVar[str] = "noop"
    version: ClassVar[str] = "1"

    def execute(self, call: cp.Call) -> cp.Receipt:
        return cp.Receipt(call.operation_id, {"ok": True}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        return cp.Receipt(call.operation_id, {"ok": True}, call.intent_digest)


def work(i: int) -> dict[str, Any]:
    """The trivial step body: a small dict."""
    return {"i": i, "ok": True}


def make_workflow(ledger: cp.Ledger) -> cp.Workflow[int]:
    """Register the benchmark workflow: ``n`` calls of ``ctx.step`` on ``work``."""

    @ledger.workflow("bench-steps", version="1")
    def steps(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.step("step", work, i)
        return n

    return steps


class LostLeases(logging.Handler):
    """Counts the "lease lost" warnings of this process's drives (attach it to the
    ``crashproof`` logger): a lease lost by a live process is a benchmark's failure."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage() == "lease lost"


def make_tempdir(parent: str | None, prefix: str = "crashproof-bench-") -> Path:
    """A fresh directory for every database of one benchmark run (``bench_dir`` removes
    it at the end; a caller of this alone removes it itself)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent)).resolve()


@contextlib.contextmanager
def bench_dir(
    parent: str | None = None, *, keep: bool = False, prefix: str = "crashproof-bench-"
) -> Iterator[Path]:
    """``make_tempdir``, removed with everything in it when the block ends: normally, on
    an error, on Ctrl-C and on SIGTERM (turned into SystemExit while the block runs, so
    that every ``finally`` of the script runs too: servers stopped, children ended).
    ``keep``: leave it, and say where."""
    directory = make_tempdir(parent, prefix)
    with exit_on_sigterm():
        try:
            yield directory
        finally:
            if keep:
                print(f"\nkept {directory}")
            else:
                shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """While the block runs, SIGTERM raises SystemExit(143) in the main thread instead of
    ending the process at once: the ``finally`` blocks that stop servers and remove
    directories run (a timeout's kill, a CI job's cancel)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def raw_commits(directory: Path, n: int, synchronous: str, tag: str) -> float:
    """Commits/s of ``n`` single-row ``BEGIN IMMEDIATE; INSERT; COMMIT`` transactions in a
    fresh WAL database with the given ``synchronous`` setting (stdlib sqlite3)."""
    path = directory / f"raw-{tag}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
        start = time.perf_counter()
        for _ in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (payload) VALUES (?)", (RAW_PAYLOAD,))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    remove_db(path)
    return n / elapsed


def crashproof_steps(directory: Path, n: int, durability: str, tag: str) -> float:
    """Steps/s of one run of ``n`` ``ctx.step`` calls on a fresh SQLite ledger. The time
    covers the whole ``ledger.run``: run_started, ``n`` step commits and run_succeeded."""
    path = directory / f"crashproof-{tag}.db"
    ledger = cp.Ledger(f"sqlite:///{path}", durability=durability)
    return timed_run(ledger, make_workflow(ledger), path, n, tag)


def context_switches() -> int:
    """Context switches of this process so far, all threads (voluntary: a thread blocked,
    e.g. on the GIL or a lock; involuntary: preempted); 0 where unknown."""
    if sys.platform == "win32":
        return 0
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)  # Linux: every thread's
    return usage.ru_nvcsw + usage.ru_nivcsw


def concurrent_acts(ledger: cp.Ledger, n: int, runs: int, tag: str) -> tuple[float, float, float]:
    """``runs`` runs of ``n`` acts each (a no-op tool), driven at once in threads on
    ``ledger``: acts/s, this process's CPU per act in microseconds (user + system, all
    threads) and its context switches per act. The caller closes the ledger. Each run's
    acts have params of their own (``run=k``): acts of the same tool with the same params
    are one intent across runs, and a second run would wait on the first's (IntentHeld)."""
    tool = NoOp()

    @ledger.workflow("bench-acts", version="1")
    def flow(ctx: cp.Context, n: int, k: int) -> int:
        for i in range(n):
            ctx.act("act", tool, run=k, i=i)
        return n

    failures: list[BaseException] = []

    def drive(k: int) -> None:
        try:
            if ledger.run(flow, run_id=f"bench:{tag}:{k}", n=n, k=k) != n:
                raise SystemExit("a benchmark run returned the wrong result")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=drive, args=(k,)) for k in range(runs)]
    switches = context_switches()
    cpu = os.times()
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    spent = os.times()
    switches = context_switches() - switches
    if failures:
        raise SystemExit(f"a benchmark run failed: {failures[0]!r}")
    acts = runs * n
    cpu_us = (spent.user - cpu.user + spent.system - cpu.system) / acts * 1e6
    return acts / elapsed, cpu_us, switches / acts


def timed_run(ledger: cp.Ledger, workflow: cp.Workflow[int], path: Path, n: int, tag: str) -> float:
    """Calls/s of one ``ledger.run`` of ``workflow`` making ``n`` calls (it must return
    ``n``); closes the ledger and removes its files."""
    try:
        start = time.perf_counter()
        result = ledger.run(workflow, run_id=f"bench:{tag}", n=n)
        elapsed = time.perf_counter() - start
    finally:
        ledger.close()
    if result != n:
        raise SystemExit(f"benchmark run returned {result!r}")
    remove_db(path)
    return n / elapsed


def remove_db(path: Path) -> None:
    """Delete a ledger and its generation witness (a ledger re-created at the same path
    beside an old witness is refused as rolled back, and rightly so)."""
    for base in (f"{path}", f"{path}.witness"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{base}{suffix}").unlink(missing_ok=True)


def interleaved(
    repeats: int, measures: dict[str, Callable[[str], float]]
) -> dict[str, list[float]]:
    """Run every measure once per round, ``repeats`` rounds, the order reversed every
    other round (a/b, b/a, a/b...): a machine that slows down or speeds up during the
    run then favours neither side."""
    results: dict[str, list[float]] = {name: [] for name in measures}
    order = list(measures.items())
    for r in range(repeats):
        for name, measure in order if r % 2 == 0 else reversed(order):
            settle()
            results[name].append(measure(f"{name}-{r}"))
    return results


def settle() -> None:
    """Write back every dirty page of the machine (os.sync) before a measure starts: each
    then begins from the same disk state, instead of paying (in its own syncs and
    checkpoints, via the filesystem's journal) for what the previous measure left
    unwritten."""
    if hasattr(os, "sync"):
        os.sync()


def median(values: list[float]) -> float:
    return statistics.median(values)


def round_ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """The ratio within each round (two measures taken back to back share the machine's
    state of the moment): its median is steadier than the ratio of the two medians."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def _filesystem(directory: Path) -> str:
    try:
        out = subprocess.run(
            ["df", "-T", str(directory)], capture_output=True, text=True, check=True, timeout=10
        ).stdout.splitlines()
        device, fstype = out[-1].split()[:2]
        return f"{fstype} on {device}"
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return "unknown"


def _revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        return subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def machine_facts(directory: Path) -> list[tuple[str, str]]:
    """What the numbers depend on. The load average shows whether the machine was busy."""
    return [
        ("date", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("cpu", _cpu_model()),
        ("cores", str(os.cpu_count())),
        ("ram", _mem_total()),
        ("os", platform.platform()),
        ("python", sys.version.split()[0]),
        ("sqlite", sqlite3.sqlite_version),
        ("crashproof", f"{cp.__version__} (git {_revision()})"),
        ("directory", str(directory)),
        ("filesystem", _filesystem(directory)),
        ("load avg", f"{load_average()} (1/5/15 min, at start)"),
    ]


def print_facts(facts: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in facts)
    for key, value in facts:
        print(f"  {key:<{width}}  {value}")


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(f"{h:<{w}}" for h, w in zip(headers, widths, strict=True))
    print(line)
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)))


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def fmt_runs(values: list[float]) -> str:
    return " / ".join(fmt_rate(v) for v in values)
