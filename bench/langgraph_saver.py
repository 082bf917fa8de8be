"""CrashproofSaver vs LangGraph's SqliteSaver: a 200-turn chat graph with its messages in
state (``add_messages``), each turn one invoke (a human message in, an AI message out).
Prints checkpoint bytes per turn (the database files' growth, WAL checkpointed) and ms
per turn, side by side.

    .venv/bin/python bench/langgraph_saver.py [TURNS]
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from crashproof.integrations.langgraph import CrashproofSaver

os.environ.setdefault("CRASHPROOF_KEY", "5e" * 32)


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


def _size(db: Path) -> int:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db.stat().st_size


def _run(name: str, saver: Any, db: Path, turns: int) -> tuple[float, float]:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "chat"}}
    start_size = _size(db) if db.exists() else 0
    started = time.perf_counter()
    for turn in range(turns):
        question = f"question {turn}: " + "please explain " * 20
        graph.invoke({"messages": [HumanMessage(question)]}, config, durability="sync")
    elapsed = time.perf_counter() - started
    got = graph.get_state(config).values["messages"]
    if len(got) != 2 * turns:
        raise SystemExit(f"{name}: {len(got)} messages, expected {2 * turns}")
    per_turn = (_size(db) - start_size) / turns
    return per_turn, 1000 * elapsed / turns


def main(turns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        conn = sqlite3.connect(root / "lg.db", check_same_thread=False)
        lg = _run("SqliteSaver", SqliteSaver(conn), root / "lg.db", turns)
        conn.close()
        with CrashproofSaver(f"sqlite:///{root / 'cp.db'}") as saver:
            ours = _run("CrashproofSaver", saver, root / "cp.db", turns)
    print(f"{turns} turns, messages in state ({2 * turns} at the end)")
    print(f"{'saver':<18}{'bytes/turn':>12}{'ms/turn':>10}")
    print(f"{'SqliteSaver':<18}{lg[0]:>12,.0f}{lg[1]:>10.2f}")
    print(f"{'CrashproofSaver':<18}{ours[0]:>12,.0f}{ours[1]:>10.2f}")
    print(f"bytes: {ours[0] / lg[0]:.3f} of SqliteSaver's; speed: {lg[1] / ours[1]:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
