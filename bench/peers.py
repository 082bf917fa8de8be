"""crashproof against its peers on the same N-step workflow, on one disk, in one process.

    .venv/bin/python bench/peers.py [--steps 1000] [--repeats 3] [--dir /tmp]

Contestants (each skipped with a message when its package is missing; install them
with ``.venv/bin/pip install --group bench``):

- raw SQLite: N single-row ``BEGIN IMMEDIATE; INSERT; COMMIT``, WAL, synchronous=FULL;
- crashproof: N ``ctx.step`` calls, ``sqlite:////abs/path.db``, durability "full";
- DBOS Transact: a ``@DBOS.workflow()`` of N ``@DBOS.step()`` calls, SQLite system database;
- LangGraph: a node that loops N times, ``SqliteSaver`` checkpointer, durability "sync"
  (a checkpoint is written before the next step starts).

Every step body is the same trivial function returning a small dict. Measurements are
interleaved (raw/crashproof/DBOS/LangGraph, repeated) and the median is reported, with
the ratio to raw commits/s. Each contestant keeps its own SQLite settings (printed).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import operator
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from _common import (
    crashproof_steps,
    exit_on_sigterm,
    fmt_rate,
    fmt_runs,
    load_average,
    machine_facts,
    make_tempdir,
    median,
    print_facts,
    print_table,
    raw_commits,
    remove_db,
    work,
)

Measure = Callable[[str], float]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pragmas(path: Path) -> str:
    """The journal mode a database file was left in (WAL is persistent; others are not)."""
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


class Peer:
    """One contestant: a name, its settings, a measure(tag) -> steps/s, and a teardown."""

    def __init__(
        self, name: str, settings: str, measure: Measure, close: Callable[[], None] | None = None
    ) -> None:
        self.name = name
        self.settings = settings
        self.measure = measure
        self.close = close or (lambda: None)


def dbos_peer(directory: Path, n: int) -> Peer | str:
    """DBOS Transact with its SQLite system database. Returns a reason string to skip."""
    version = _version("dbos")
    if version is None:
        return "dbos is not installed"
    from dbos import DBOS, SetWorkflowID

    path = directory / "dbos.db"
    DBOS(
        config={
            "name": "crashproof-bench",
            "system_database_url": f"sqlite:///{path}",
            "log_level": "WARNING",
            "application_version": "bench",
        }
    )

    @DBOS.step(name="bench_step")
    def step(i: int) -> dict[str, Any]:
        return work(i)

    @DBOS.workflow(name="bench_steps")
    def steps(count: int) -> int:
        for i in range(count):
            step(i)
        return count

    DBOS.launch()

    def measure(tag: str) -> float:
        start = time.perf_counter()
        with SetWorkflowID(f"bench-{tag}"):
            result = steps(n)
        elapsed = time.perf_counter() - start
        assert result == n
        return n / elapsed

    settings = (
        f"dbos {version}; system DB journal_mode={_pragmas(path)}, "
        "synchronous=default (FULL); SQLAlchemy"
    )
    return Peer("DBOS Transact", settings, measure, DBOS.destroy)


class _LoopState(TypedDict):
    i: int
    n: int
    out: dict[str, Any]


def langgraph_peer(directory: Path, n: int) -> Peer | str:
    """LangGraph: one node looping N times, SqliteSaver, durability="sync"."""
    version = _version("langgraph")
    saver_version = _version("langgraph-checkpoint-sqlite")
    if version is None or saver_version is None:
        return "langgraph and/or langgraph-checkpoint-sqlite are not installed"
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def node(state: _LoopState) -> dict[str, Any]:
        return {"i": state["i"] + 1, "out": work(state["i"])}

    def route(state: _LoopState) -> str:
        return "step" if state["i"] < state["n"] else END

    graph = StateGraph(_LoopState)
    graph.add_node("step", node)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route)

    def measure(tag: str) -> float:
        path = directory / f"langgraph-{tag}.db"
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            app = graph.compile(checkpointer=SqliteSaver(conn))
            config: Any = {"configurable": {"thread_id": tag}, "recursion_limit": n + 10}
            start = time.perf_counter()
            state = app.invoke({"i": 0, "n": n, "out": {}}, config, durability="sync")
            elapsed = time.perf_counter() - start
            (synchronous,) = conn.execute("PRAGMA synchronous").fetchone()
        finally:
            conn.close()
        assert state["i"] == n, state
        assert synchronous == 2, synchronous  # FULL: the comparison is fair
        remove_db(path)
        return n / elapsed

    settings = (
        f"langgraph {version}, langgraph-checkpoint-sqlite {saver_version}; "
        "WAL, synchronous=FULL (default), durability=sync"
    )
    return Peer("LangGraph", settings, measure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="N steps per run (1000)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions, median kept (3)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)
    n = args.steps
    logging.basicConfig(level=logging.WARNING)

    directory = make_tempdir(args.dir)
    peers = [
        Peer(
            "raw SQLite commits",
            "stdlib sqlite3, WAL, synchronous=FULL",
            lambda tag: raw_commits(directory, n, "FULL", tag),
        ),
        Peer(
            "crashproof",
            "sqlite:////abs/path.db, durability=full (WAL, synchronous=FULL)",
            lambda tag: crashproof_steps(directory, n, "full", tag),
        ),
    ]
    skipped: list[tuple[str, str]] = []
    try:
        for name, make in (("DBOS Transact", dbos_peer), ("LangGraph", langgraph_peer)):
            try:
                got = make(directory, n)
            except Exception as exc:
                got = f"setup failed: {type(exc).__name__}: {exc}"
            if isinstance(got, str):
                skipped.append((name, got))
            else:
                peers.append(got)

        print("crashproof peers benchmark")
        print_facts(machine_facts(directory))
        print(f"\nN = {n:,} steps per run, {args.repeats} interleaved repeats, median kept\n")
        results: dict[str, list[float]] = {p.name: [] for p in peers}
        for r in range(args.repeats):
            for peer in peers:
                if peer.name in results:
                    try:
                        results[peer.name].append(peer.measure(f"{r}"))
                    except Exception as exc:
                        skipped.append((peer.name, f"failed: {type(exc).__name__}: {exc}"))
                        del results[peer.name]

        raw = median(results["raw SQLite commits"])
        rows = []
        for peer in peers:
            if peer.name not in results:
                continue
            rates = results[peer.name]
            rows.append(
                [
                    peer.name,
                    fmt_runs(rates),
                    fmt_rate(median(rates)),
                    f"{median(rates) / raw:.3f}",
                ]
            )
        print_table(["contestant", "runs (steps/s)", "median steps/s", "ratio to raw"], rows)
        print("\nsettings:")
        for peer in sorted(peers, key=operator.attrgetter("name")):
            if peer.name in results:
                print(f"  {peer.name}: {peer.settings}")
        for name, why in skipped:
            print(f"  {name}: SKIPPED ({why})")
        print(f"\nload avg at end: {load_average()}")
    finally:
        for peer in peers:
            peer.close()
        if args.keep:
            print(f"\nkept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    with exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
