"""Many concurrent agent runs: crashproof async against crashproof threads and the peers.

    .venv/bin/python bench/concurrency.py [--runs 1,64,256,1024] [--dir /tmp]
                                          [--only NAME,...] [--postgres]
                                          [--lease-seconds S]

Every run makes 10 awaited "model calls" of 50 ms and one act with lookup, so the ideal
wall time is 0.5 s whatever the number of runs R. Contestants (each in a child process
of its own, so that its peak RSS is its own; a peer whose package is missing is skipped
with a message, install them with ``.venv/bin/pip install --group bench aiosqlite``):

- crashproof async: ``await ledger.run_async`` of R runs on one event loop, the model
  call an ``async def`` decision, the act an async tool with lookup;
- crashproof threads: R threads, each ``ledger.run`` with a sleeping decision;
- LangGraph: ``ainvoke`` of R threads of a graph (a model node looping 10 times, then an
  act node), ``AsyncSqliteSaver``, durability "sync";
- DBOS async: an async ``@DBOS.workflow`` of 10 async ``@DBOS.step`` calls and an act step.

Printed per contestant and R: wall / ideal, runs/s, peak RSS (MiB). A lease lost by these
live processes (a "lease lost" warning) is a failure: crashproof's line says how many
and the bench exits 1. ``--lease-seconds``: crashproof's lease (default 15 s, the
library's: runs this short never renew; 0.3 makes every run renew a few times). ``--postgres``
measures crashproof on its own throwaway PostgreSQL server too (tests/postgres_server.py).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.metadata
import json
import logging
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from _common import (
    LostLeases,
    exit_on_sigterm,
    load_average,
    machine_facts,
    make_tempdir,
    print_facts,
)

import crashproof as cp

CALLS, CALL_SECONDS = 10, 0.05
LEASE_SECONDS = 15.0  # --lease-seconds
IDEAL = CALLS * CALL_SECONDS
ROOT = Path(__file__).resolve().parent.parent


# -- the act: one effect per operation id, with lookup --------------------------------


class _Effects:
    """The target: effects by operation id (in memory: the act's cost is crashproof's)."""

    done: ClassVar[dict[str, str]] = {}


class AsyncNote(cp.Tool):
    name: ClassVar[str] = "note"

    async def execute(self, call: cp.Call) -> cp.Receipt:
        _Effects.done.setdefault(call.operation_id, call.intent_digest)
        return cp.Receipt(call.operation_id, {"ok": True}, _Effects.done[call.operation_id])

    async def lookup(self, call: cp.Call) -> cp.Receipt | None:
        digest = _Effects.done.get(call.operation_id)
        return None if digest is None else cp.Receipt(call.operation_id, {"ok": True}, digest)


class SyncNote(cp.Tool):
    name: ClassVar[str] = "note"

    def execute(self, call: cp.Call) -> cp.Receipt:
        _Effects.done.setdefault(call.operation_id, call.intent_digest)
        return cp.Receipt(call.operation_id, {"ok": True}, _Effects.done[call.operation_id])

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        digest = _Effects.done.get(call.operation_id)
        return None if digest is None else cp.Receipt(call.operation_id, {"ok": True}, digest)


# -- the contestants (each runs R runs and returns the wall time) ----------------------


def crashproof_async(url: str, runs: int) -> float:
    async def model(i: int) -> cp.Decision:
        await asyncio.sleep(CALL_SECONDS)
        return cp.Decision({"turn": i}, model="m", usage={"total_tokens": 10})

    tool = AsyncNote()

    @cp.workflow("bench-async")
    async def agent(ctx: cp.AsyncContext) -> int:
        for i in range(CALLS):
            await ctx.decide("model", model, i)
        # Each run's own note: identical intents of concurrent runs would wait on each
        # other (an unresolved intent is held across runs: runtime/guards/holds.py).
        await ctx.act("note", tool, text=f"done by {ctx.run_id}")
        return CALLS

    async def all_runs(ledger: cp.Ledger) -> list[int]:
        return await asyncio.gather(*(ledger.run_async(agent, run_id=f"r{k}") for k in range(runs)))

    with cp.Ledger(url, lease_seconds=LEASE_SECONDS) as ledger:
        start = time.perf_counter()
        results = asyncio.run(all_runs(ledger))
        wall = time.perf_counter() - start
    if results != [CALLS] * runs:
        raise RuntimeError(f"crashproof async: {results[:3]}")
    return wall


def crashproof_threads(url: str, runs: int) -> float:
    def model(i: int) -> cp.Decision:
        time.sleep(CALL_SECONDS)
        return cp.Decision({"turn": i}, model="m", usage={"total_tokens": 10})

    tool = SyncNote()

    @cp.workflow("bench-threads")
    def agent(ctx: cp.Context) -> int:
        for i in range(CALLS):
            ctx.decide("model", model, i)
        ctx.act("note", tool, text=f"done by {ctx.run_id}")
        return CALLS

    with cp.Ledger(url, lease_seconds=LEASE_SECONDS) as ledger:
        ledger.register(agent)
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=runs) as pool:
            results = list(pool.map(lambda k: ledger.run(agent, run_id=f"r{k}"), range(runs)))
        wall = time.perf_counter() - start
    if results != [CALLS] * runs:
        raise RuntimeError(f"crashproof threads: {results[:3]}")
    return wall


class _Turns(TypedDict):
    i: int
    acted: bool


def langgraph_async(directory: Path, runs: int) -> float:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.graph import END, START, StateGraph

    async def model(state: _Turns) -> dict[str, Any]:
        await asyncio.sleep(CALL_SECONDS)
        return {"i": state["i"] + 1}

    async def act(state: _Turns) -> dict[str, Any]:
        return {"acted": True}

    graph = StateGraph(_Turns)
    graph.add_node("model", model)
    graph.add_node("act", act)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "model" if s["i"] < CALLS else "act")
    graph.add_edge("act", END)

    async def all_runs() -> list[Any]:
        async with AsyncSqliteSaver.from_conn_string(str(directory / "lg.db")) as saver:
            app = graph.compile(checkpointer=saver)

            async def one(k: int) -> Any:
                config: Any = {"configurable": {"thread_id": f"r{k}"}, "recursion_limit": 50}
                return await app.ainvoke({"i": 0, "acted": False}, config, durability="sync")

            return await asyncio.gather(*(one(k) for k in range(runs)))

    start = time.perf_counter()
    states = asyncio.run(all_runs())
    wall = time.perf_counter() - start
    if any(s["i"] != CALLS or not s["acted"] for s in states):
        raise RuntimeError("langgraph: a run did not finish")
    return wall


def dbos_async(directory: Path, runs: int) -> float:
    from dbos import DBOS, SetWorkflowID

    DBOS(
        config={
            "name": "crashproof-bench-concurrency",
            "system_database_url": f"sqlite:///{directory / 'dbos.db'}",
            "log_level": "WARNING",
            "application_version": "bench",
        }
    )

    @DBOS.step(name="model")
    async def model(i: int) -> dict[str, int]:
        await asyncio.sleep(CALL_SECONDS)
        return {"turn": i}

    @DBOS.step(name="act")
    async def act() -> bool:
        return True

    @DBOS.workflow(name="agent")
    async def agent() -> int:
        for i in range(CALLS):
            await model(i)
        await act()
        return CALLS

    async def all_runs() -> list[int]:
        async def one(k: int) -> int:
            with SetWorkflowID(f"r{k}"):
                return await agent()

        return await asyncio.gather(*(one(k) for k in range(runs)))

    DBOS.launch()
    try:
        start = time.perf_counter()
        results = asyncio.run(all_runs())
        wall = time.perf_counter() - start
    finally:
        DBOS.destroy()
    if results != [CALLS] * runs:
        raise RuntimeError(f"dbos: {results[:3]}")
    return wall


CONTESTANTS = ("crashproof async", "crashproof threads", "LangGraph async", "DBOS async")
NEEDS = {"LangGraph async": ("langgraph-checkpoint-sqlite", "aiosqlite"), "DBOS async": ("dbos",)}


def _missing(name: str) -> str | None:
    for dist in NEEDS.get(name, ()):
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return f"{dist} is not installed"
    return None


def child(name: str, runs: int, directory: Path, url: str | None) -> dict[str, Any]:
    """One measurement in this (child) process: wall time, peak RSS, leases lost."""
    lost = LostLeases()
    logging.getLogger("crashproof").addHandler(lost)
    if name == "crashproof async":
        wall = crashproof_async(url or f"sqlite:///{directory / 'cp.db'}", runs)
    elif name == "crashproof threads":
        wall = crashproof_threads(url or f"sqlite:///{directory / 'cp.db'}", runs)
    elif name == "LangGraph async":
        wall = langgraph_async(directory, runs)
    elif name == "DBOS async":
        wall = dbos_async(directory, runs)
    else:
        raise ValueError(name)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall": wall, "rss_mib": rss_mib, "leases_lost": lost.count}


def measure(name: str, runs: int, parent: Path, url: str | None) -> dict[str, Any] | str:
    directory = make_tempdir(str(parent))
    try:
        argv = [sys.executable, __file__, "--child", name, "--runs", str(runs)]
        argv += ["--dir", str(directory)] + (["--url", url] if url else [])
        argv += ["--lease-seconds", str(LEASE_SECONDS)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            return f"failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    global LEASE_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="1,64,256,1024")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--only", default=None, help="contestants by name, comma-separated")
    parser.add_argument("--postgres", action="store_true", help="crashproof on PostgreSQL too")
    parser.add_argument("--lease-seconds", type=float, default=15.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    counts = [int(r) for r in args.runs.split(",")]
    LEASE_SECONDS = args.lease_seconds
    if args.child is not None:
        print(json.dumps(child(args.child, counts[0], Path(args.dir), args.url)))
        return 0
    parent = make_tempdir(args.dir)
    print(
        f"{CALLS} model calls of {CALL_SECONDS * 1000:.0f} ms + 1 act per run; ideal wall "
        f"{IDEAL:.2f} s"
    )
    print_facts(machine_facts(parent))
    print(f"  crashproof lease: {LEASE_SECONDS:g} s (renewed every third)")
    lost_any = 0
    targets: list[tuple[str, str | None]] = [(n, None) for n in CONTESTANTS]
    server = None
    if args.postgres:
        sys.path.insert(0, str(ROOT / "tests"))
        from postgres_server import PostgresServer, find_bindir

        server = PostgresServer(find_bindir())
        server.start()
        targets += [("crashproof async", "pg"), ("crashproof threads", "pg")]
    try:
        print(f"  {'contestant':<28} {'R':>5} {'wall/ideal':>10} {'runs/s':>8} {'peak RSS':>9}")
        rates: dict[tuple[str, int], float] = {}
        for name, store in targets:
            if args.only and name not in args.only.split(","):
                continue
            label = f"{name}{' (PostgreSQL)' if store else ''}"
            missing = _missing(name)
            if missing:
                print(f"  {label:<28} skipped: {missing}")
                continue
            for runs in counts:
                # A pool as large as the commit threads (the default is 4 connections).
                url = f"{server.create_database()}?pool_size=32" if server and store else None
                got = measure(name, runs, parent, url)
                if isinstance(got, str):
                    print(f"  {label:<28} {runs:>5} {got}")
                    continue
                lost = got.get("leases_lost", 0)
                lost_any += lost
                print(
                    f"  {label:<28} {runs:>5} {got['wall'] / IDEAL:>9.2f}x "
                    f"{runs / got['wall']:>8.1f} {got['rss_mib']:>6.0f} MiB"
                    + (f"  FAILED: {lost} leases lost" if lost else ""),
                    flush=True,
                )
                rates[(label, runs)] = runs / got["wall"]
        # The issue's yardstick: the async design's throughput over the threads', same run.
        for (label, runs), rate in rates.items():
            threads = rates.get((label.replace("async", "threads"), runs))
            if label.startswith("crashproof async") and threads:
                print(f"  {label} / threads, R={runs}: {rate / threads:.2f}x the throughput")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(parent, ignore_errors=True)
    print(f"  load average after: {load_average()}")
    if lost_any:
        print(f"FAILED: live runs lost {lost_any} leases")
        return 1
    return 0


if __name__ == "__main__":
    with exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
