"""A growing transcript: journal µs per turn, resume time and bytes per turn (#22).

    .venv/bin/python bench/transcript.py [--turns 50,200,500,1000,10000] [--before SRC]
                                         [--peer-max 200] [--dir /tmp]

The agent loop of the issue: each turn appends a user message (~1 KB of new text) to the
history, passes the whole history to ``ctx.decide("turn", model, messages=history)``,
whose instant model answers ~1 KB, and appends the answer: ~2 KB of new text per turn.
Each case runs in its own child process: T turns in a fresh SQLite ledger (durability
"normal": no fsync, so the journal's own cost shows), crashed before the last turn's
commit, then resumed by a new ledger in a new process. Printed per case: µs per turn
(live), resume time of the crashed run (opening the ledger included), bytes on disk per
turn (database + WAL + witness) and per turn of new text.

Contestants: crashproof with a plain list and with ``cp.Transcript``; ``--before SRC``:
crashproof at another checkout's ``src`` (e.g. main before #22, whose digest is O(T) per
turn: capped at T = 1,000 there, as its run is O(T²)); LangGraph (messages in state,
``add`` reducer, ``SqliteSaver``, ``durability="sync"``), which checkpoints the whole
state each step: capped at ``--peer-max`` turns (its bytes grow as T²).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)
TEXT = "The quick brown fox jumps over the lazy dog; " * 22  # ~1 KB, ASCII
BEFORE_MAX = 1000


def _user(turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"turn {turn}: {TEXT}"}


def _reply(n: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer to {n} messages: {TEXT}"}


def _disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def child_crashproof(kind: str, turns: int, directory: Path, phase: str) -> dict[str, Any]:
    """One phase (``live``: T turns, crashed before the last commit; ``resume``)."""
    import crashproof as cp

    url = f"sqlite:///{directory / 'ledger.db'}"

    def model(messages: list[Any], model: str) -> dict[str, str]:
        return _reply(len(messages))

    def register(ledger: Any) -> None:
        @ledger.workflow("agent", version="1")
        def agent(ctx: Any, turns: int) -> int:
            system = {"role": "system", "content": "You are a terse assistant."}
            history: list[Any] = cp.Transcript([system]) if kind == "transcript" else [system]
            for turn in range(turns):
                history.append(_user(turn))
                history.append(ctx.decide("turn", model, messages=history, model="m-1"))
            return len(history)

    if phase == "live":
        points = cp.CrashPoints(match=f"before_commit[step_done:turn#{turns}]")
        ledger = cp.Ledger(url, durability="normal", crash_points=points)
        register(ledger)
        started = time.perf_counter()
        with contextlib.suppress(cp.SimulatedCrash):
            ledger.run("agent", run_id="r", turns=turns)
        elapsed = time.perf_counter() - started
        ledger.close()
        return {"us_per_turn": elapsed / turns * 1e6}
    started = time.perf_counter()
    with cp.Ledger(url, durability="normal") as ledger:
        register(ledger)
        result = ledger.resume("r")
    elapsed = time.perf_counter() - started
    if result != 2 * turns + 1:
        raise SystemExit(f"resume returned {result!r}")
    return {"resume_s": elapsed, "bytes_per_turn": _disk(directory) / turns}


def child_langgraph(turns: int, directory: Path, phase: str) -> dict[str, Any]:
    import operator
    import sqlite3
    from typing import Annotated, TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    # The functional form: evaluated now (LangGraph reads the hints; this module's
    # annotations are strings, which it could not resolve inside a function).
    State = TypedDict(  # noqa: UP013
        "State",
        {"messages": Annotated[list[dict[str, str]], operator.add], "turn": int, "stop": int},
    )

    def node(state: Any) -> dict[str, Any]:
        turn = state["turn"]
        history = state["messages"] + [_user(turn)]
        return {"messages": [_user(turn), _reply(len(history))], "turn": turn + 1}

    def more(state: Any) -> str:
        return "model" if state["turn"] < state["stop"] else END

    conn = sqlite3.connect(directory / "lg.db", check_same_thread=False)
    graph_builder = StateGraph(State)
    graph_builder.add_node("model", node)
    graph_builder.add_edge(START, "model")
    graph_builder.add_conditional_edges("model", more)
    graph = graph_builder.compile(checkpointer=SqliteSaver(conn))
    config = {"configurable": {"thread_id": "r"}, "recursion_limit": 10 * turns + 10}
    started = time.perf_counter()
    if phase == "live":  # T-1 turns: "crashed before the last"
        system = {"role": "system", "content": "You are a terse assistant."}
        graph.invoke(
            {"messages": [system], "turn": 0, "stop": turns - 1}, config, durability="sync"
        )
        elapsed = time.perf_counter() - started
        conn.close()
        return {"us_per_turn": elapsed / (turns - 1) * 1e6}
    graph.update_state(config, {"stop": turns})  # the resume: from the last checkpoint
    out = graph.invoke(None, config, durability="sync")
    elapsed = time.perf_counter() - started
    conn.close()
    if len(out["messages"]) != 2 * turns + 1:
        raise SystemExit(f"langgraph ended with {len(out['messages'])} messages")
    return {"resume_s": elapsed, "bytes_per_turn": _disk(directory) / turns}


def run_case(who: str, turns: int, parent: str | None, before: str | None) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="crashproof-transcript-", dir=parent))
    env = dict(os.environ)
    if who == "before":
        env["PYTHONPATH"] = before or ""
    out: dict[str, Any] = {}
    try:
        for phase in ("live", "resume"):
            argv = [sys.executable, __file__, "--child", who, str(turns), str(directory), phase]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{who} T={turns} {phase} failed:\n{done.stderr[-3000:]}")
            out.update(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", default="50,200,500,1000,10000")
    parser.add_argument("--before", help="another checkout's src/ (crashproof before #22)")
    parser.add_argument("--peer-max", type=int, default=200, help="LangGraph: up to T turns")
    parser.add_argument("--dir", default=None, help="where the databases go")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        who, turns, directory, phase = args.child
        if who == "langgraph":
            result = child_langgraph(int(turns), Path(directory), phase)
        else:
            kind = "transcript" if who == "transcript" else "list"
            result = child_crashproof(kind, int(turns), Path(directory), phase)
        print(json.dumps(result))
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine_facts, print_facts

    print_facts(machine_facts(Path(args.dir or tempfile.gettempdir())))
    new_text = len(json.dumps(_user(0))) + len(json.dumps(_reply(1)))
    print(f"new text per turn: ~{new_text} bytes (user message + reply, JSON)")
    contestants = ["list", "transcript"]
    if args.before:
        contestants.insert(0, "before")
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401

        contestants.append("langgraph")
    except ImportError:
        print("langgraph: skipped (pip install langgraph langgraph-checkpoint-sqlite)")
    header = f"{'contestant':<22}{'T':>7}{'µs/turn':>10}{'resume':>10}{'B/turn':>10}{'x new':>7}"
    print(header)
    for turns in [int(t) for t in args.turns.split(",")]:
        for who in contestants:
            if (who == "before" and turns > BEFORE_MAX) or (
                who == "langgraph" and turns > args.peer_max
            ):
                continue
            r = run_case(who, turns, args.dir, args.before)
            name = {"before": "crashproof before #22", "list": "crashproof, list"}.get(
                who, "crashproof, Transcript" if who == "transcript" else "LangGraph"
            )
            print(
                f"{name:<22}{turns:>7}{r['us_per_turn']:>10.0f}"
                f"{r['resume_s'] * 1e3:>8.0f}ms{r['bytes_per_turn']:>10.0f}"
                f"{r['bytes_per_turn'] / new_text:>7.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
