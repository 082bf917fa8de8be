"""CrashproofSaver vs LangGraph's SqliteSaver and AsyncSqliteSaver: a chat graph with its
messages in state (``add_messages``), each turn one invoke (a ~300-byte human message in,
a ~700-byte AI message out), ``durability="sync"``. The sync savers run ``invoke``, the
async ones ``ainvoke``; CrashproofSaver runs both ways, each beside its peer.

Prints checkpoint bytes per turn (the database file's growth from the saver's empty
tables, WAL checkpointed; CrashproofSaver's witness file, a few KB, is not counted) and ms
per turn (the median of interleaved rounds, the order reversed every other round), and
the ratios: bytes as a fraction of the peer's, speed as the peer's ms over ours (> 1:
faster than the peer). Every saver syncs each commit: LangGraph's SQLite savers keep
SQLite's default ``synchronous=FULL`` (WAL), CrashproofSaver its default ``full``.

    .venv/bin/python bench/langgraph_saver.py [--turns 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import _common

# This file is named after the project it measures: with its own folder first on
# sys.path, ``import langgraph`` would import this script. The folder is dropped once
# _common is in.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: E402
from langgraph.graph import START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

from crashproof.integrations.langgraph import CrashproofSaver  # noqa: E402


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _graph(saver: Any) -> Any:
    def reply(state: State) -> dict[str, Any]:
        text = f"answer {len(state['messages'])}: " + "lorem ipsum " * 60  # ~700 bytes
        return {"messages": [AIMessage(text)]}

    graph = StateGraph(State)
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    return graph.compile(checkpointer=saver)


def _question(turn: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"question {turn}: " + "please explain " * 20)]}


def _size(db: Path) -> int:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db.stat().st_size


def _check(name: str, graph: Any, state: Any, turns: int) -> None:
    got = state.values["messages"]
    if len(got) != 2 * turns:
        raise SystemExit(f"{name}: {len(got)} messages, expected {2 * turns}")


_CONFIG: Any = {"configurable": {"thread_id": "chat"}}


def _sync(name: str, saver: Any, turns: int) -> float:
    graph = _graph(saver)
    started = time.perf_counter()
    for turn in range(turns):
        graph.invoke(_question(turn), _CONFIG, durability="sync")
    elapsed = time.perf_counter() - started
    _check(name, graph, graph.get_state(_CONFIG), turns)
    return elapsed


async def _async(name: str, saver: Any, turns: int) -> float:
    graph = _graph(saver)
    started = time.perf_counter()
    for turn in range(turns):
        await graph.ainvoke(_question(turn), _CONFIG, durability="sync")
    elapsed = time.perf_counter() - started
    _check(name, graph, await graph.aget_state(_CONFIG), turns)
    return elapsed


class Contestants:
    """Each measure runs one saver on a fresh database for ``turns`` turns; returns ms
    per turn and keeps the bytes per turn."""

    def __init__(self, root: Path, turns: int) -> None:
        self.root, self.turns = root, turns
        self.bytes: dict[str, float] = {}

    def _db(self, tag: str) -> Path:
        return self.root / f"{tag}.db"

    def _done(self, name: str, db: Path, elapsed: float, start: int = 0) -> float:
        self.bytes[name] = (_size(db) - start) / self.turns
        return 1000 * elapsed / self.turns

    def sqlite(self, tag: str) -> float:
        db = self._db(tag)
        conn = sqlite3.connect(db, check_same_thread=False)
        try:
            elapsed = _sync("SqliteSaver", SqliteSaver(conn), self.turns)
        finally:
            conn.close()
        return self._done("SqliteSaver", db, elapsed)

    def crashproof(self, tag: str) -> float:
        db = self._db(tag)
        with CrashproofSaver(f"sqlite:///{db}") as saver:
            start = _size(db)  # the ledger's own empty tables are not the checkpoints'
            elapsed = _sync("CrashproofSaver", saver, self.turns)
        return self._done("CrashproofSaver", db, elapsed, start)

    def async_sqlite(self, tag: str) -> float:
        db = self._db(tag)

        async def run() -> float:
            async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
                return await _async("AsyncSqliteSaver", saver, self.turns)

        return self._done("AsyncSqliteSaver", db, asyncio.run(run()))

    def async_crashproof(self, tag: str) -> float:
        db = self._db(tag)

        start = 0

        async def run() -> float:
            nonlocal start
            with CrashproofSaver(f"sqlite:///{db}") as saver:
                start = _size(db)
                return await _async("CrashproofSaver async", saver, self.turns)

        elapsed = asyncio.run(run())
        return self._done("CrashproofSaver async", db, elapsed, start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"LangGraph checkpointers, {args.turns} turns ({2 * args.turns} messages at the end)")
    with _common.bench_dir(prefix="cp-bench-langgraph-") as root:
        _common.print_facts(_common.machine_facts(root))
        runs = Contestants(root, args.turns)
        ms = _common.interleaved(
            args.repeats,
            {
                "SqliteSaver": runs.sqlite,
                "CrashproofSaver": runs.crashproof,
                "AsyncSqliteSaver": runs.async_sqlite,
                "CrashproofSaver async": runs.async_crashproof,
            },
        )
    print(f"  load avg  {_common.load_average()} (at the end)\n")
    rows = [
        [name, f"{runs.bytes[name]:,.0f}", f"{_common.median(v):.2f}", _fmt(v)]
        for name, v in ms.items()
    ]
    _common.print_table(["saver", "bytes/turn", "ms/turn", "rounds"], rows)
    print()
    for ours, peer in (
        ("CrashproofSaver", "SqliteSaver"),
        ("CrashproofSaver async", "AsyncSqliteSaver"),
    ):
        speed = _common.median(_common.round_ratios(ms[peer], ms[ours]))
        print(
            f"{ours} vs {peer}: bytes {runs.bytes[ours] / runs.bytes[peer]:.3f} of its; "
            f"speed {speed:.2f}x (median of the rounds' ratios)"
        )


def _fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
