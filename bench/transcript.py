"""A growing transcript: journal µs per turn, resume time and bytes per turn (#22).

    .venv/bin/python bench/transcript.py [--turns 50,200,500,1000,10000] [--before SRC]
                                         [--peer-max 200] [--dbos-cap 600] [--dir /tmp]
                                         [--whole] [--only list,whole,...]

The agent loop of the issue: each turn appends a user message (~1 KB of new text) to the
history, passes the whole history to ``ctx.decide("turn", model, messages=history)``,
whose instant model answers ~1 KB, and appends the answer: ~2 KB of new text per turn.
Each case runs in its own child process: T turns in a fresh SQLite ledger (durability
"normal": no fsync, so the journal's own cost shows), really crashed in the last turn
(the process SIGKILLs itself inside the last turn's model call / step, before its result is
recorded), then resumed by a new ledger in a new process. Printed per case: µs per turn
(live), resume time of the crashed run (opening the ledger included), bytes on disk per
turn (database + WAL + witness) and per turn of new text. Bytes per turn are what each
turn adds: (size after T turns - size after 2 turns) / (T - 2), the same run of 2 turns
measured once per contestant; that base (the empty database's tables and indexes, the
run's own records) is printed beside it, as it does not grow with T.

Contestants: crashproof with a plain list and with ``cp.Transcript`` (each storing its
requests for people to read, the default), "list-off" a plain list with
``store_requests=False``; ``--before SRC``:
crashproof at another checkout's ``src`` (e.g. main before #22, whose digest is O(T) per
turn: capped at T = 1,000 there, as its run is O(T²)); LangGraph (messages in state,
``add`` reducer, ``SqliteSaver``, ``durability="sync"``), which checkpoints the whole
state each step: capped at ``--peer-max`` turns (its bytes grow as T²); its "crash" is a
run of T-1 turns then a resume from the last checkpoint in a new process (LangGraph has no
in-flight step to kill mid-turn: a killed superstep restarts from the same checkpoint). DBOS
Transact (SQLite system database; a workflow whose ``@DBOS.step`` takes the messages),
SIGKILLed in its last step and recovered by ``DBOS.launch()`` in a new process; each phase
bounded by ``--dbos-cap`` seconds, printed as "over cap" past it.

``--rounds N`` (#42): the resume side by side instead. Each contestant's run of T turns
is made once (LangGraph's live phase then runs with ``durability="exit"``: one
checkpoint at the end, the very checkpoint its resume reads, so T = 10,000 fits on a
disk; with ``--before SRC`` also "before" and "before-transcript", crashproof imported
from SRC); then N rounds, each resuming every contestant once from a fresh copy of its
crashed files (the order rotated each round), each in a new process, with the load
average read before each resume. Printed: each contestant's median resume and range,
and the median over rounds of crashproof's resume over LangGraph's in the same round.

``--whole``: also crashproof with a decision that *returns* the whole history (the turn's
result is the history so far plus the reply), up to T = 1,000: each result extends the
one before, which a SQLite ledger stores as a text delta (schema 7, store/deltas.py), so
its bytes per turn stay O(new text); its time does not (each full result is still
encoded, sealed and, on resume, verified: O(T) per turn). With ``--before``, the same at
the other checkout ("whole, before"), which stores each history whole.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)
TEXT = "The quick brown fox jumps over the lazy dog; " * 22  # ~1 KB, ASCII
BEFORE_MAX = 1000
WHOLE_MAX = 1000  # --whole: O(T) per turn in hashing whatever is stored


def _user(turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"turn {turn}: {TEXT}"}


def _reply(n: int) -> dict[str, str]:
    return {"role": "assistant", "content": f"answer to {n} messages: {TEXT}"}


def _disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def child_crashproof(
    kind: str, turns: int, directory: Path, phase: str, requests: bool = True
) -> dict[str, Any]:
    """One phase (``live``: T turns, crashed before the last commit; ``resume``).
    ``requests``: ``Ledger(store_requests=...)`` (the "list-off" contestant: False)."""
    # crashproof.store.sqlite is imported by the first SQLite ledger: kept out of the
    # timed resume, as the peers' modules are.
    import crashproof as cp
    import crashproof.runtime.ledger
    import crashproof.store.sqlite

    url = f"sqlite:///{directory / 'ledger.db'}"

    started = time.perf_counter()

    def model(messages: list[Any], model: str) -> dict[str, str]:
        if phase == "live" and len(messages) == 2 * turns:  # the last turn: crash here
            _killed_here(directory, started, turns - 1)
        return _reply(len(messages))

    answer = model  # (whole's keyword model= shadows it)

    def whole(messages: list[Any], model: str) -> list[Any]:
        return [*messages, answer(messages, model)]

    def register(ledger: Any) -> None:
        @ledger.workflow("agent", version="1")
        def agent(ctx: Any, turns: int) -> int:
            system = {"role": "system", "content": "You are a terse assistant."}
            history: list[Any] = cp.Transcript([system]) if kind == "transcript" else [system]
            for turn in range(turns):
                history.append(_user(turn))
                if kind == "whole":  # the result is the history: stored as a delta
                    history = ctx.decide("turn", whole, messages=history, model="m-1")
                else:
                    history.append(ctx.decide("turn", model, messages=history, model="m-1"))
            return len(history)

    if phase == "live":
        ledger = cp.Ledger(url, durability="normal", store_requests=requests)
        register(ledger)
        started = time.perf_counter()
        ledger.run("agent", run_id="r", turns=turns)
        raise SystemExit("crashproof: the live run was not killed")
    started = time.perf_counter()
    with cp.Ledger(url, durability="normal", store_requests=requests) as ledger:
        register(ledger)
        result = ledger.resume("r")
        # Timed to the resume's end, before the ledger closes (its WAL checkpoint), as
        # LangGraph's and DBOS's resumes are timed before their connections close.
        elapsed = time.perf_counter() - started
    if result != 2 * turns + 1:
        raise SystemExit(f"resume returned {result!r}")
    return {"resume_s": elapsed, "bytes_per_turn": _disk(directory) / turns}


def _killed_here(directory: Path, started: float, done_turns: int) -> None:
    """A real crash before the last turn: note the live time, then SIGKILL this process."""
    elapsed = time.perf_counter() - started
    (directory / "live.json").write_text(json.dumps({"us_per_turn": elapsed / done_turns * 1e6}))
    os.kill(os.getpid(), signal.SIGKILL)


def child_dbos(turns: int, directory: Path, phase: str) -> dict[str, Any]:
    """DBOS Transact, SQLite system database: a workflow whose step takes the messages.

    Live: T turns, the process SIGKILLed inside the last turn's step (before its output is
    recorded). Resume: a fresh process launches DBOS, whose recovery restarts the pending
    workflow; timed until its result, the launch included.
    """
    from dbos import DBOS, SetWorkflowID

    started = time.perf_counter()
    DBOS(
        config={
            "name": "crashproof-transcript",
            "system_database_url": f"sqlite:///{directory / 'dbos.db'}",
            "log_level": "WARNING",
            "application_version": "bench",
        }
    )

    @DBOS.step(name="turn")
    def turn_step(messages: list[dict[str, str]]) -> dict[str, str]:
        if phase == "live" and len(messages) == 2 * turns:
            _killed_here(directory, started, turns - 1)
        return _reply(len(messages))

    @DBOS.workflow(name="agent")
    def agent(turns: int) -> int:
        history = [{"role": "system", "content": "You are a terse assistant."}]
        for turn in range(turns):
            history.append(_user(turn))
            history.append(turn_step(history))
        return len(history)

    DBOS.launch()
    if phase == "live":
        started = time.perf_counter()
        with SetWorkflowID("r"):
            agent(turns)
        raise SystemExit("dbos: the live run was not killed")
    result = DBOS.retrieve_workflow("r").get_result()
    elapsed = time.perf_counter() - started
    DBOS.destroy()
    if result != 2 * turns + 1:
        raise SystemExit(f"dbos resume returned {result!r}")
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
    if phase in ("live", "live-exit"):  # T-1 turns: "crashed before the last"
        system = {"role": "system", "content": "You are a terse assistant."}
        durability = "exit" if phase == "live-exit" else "sync"
        graph.invoke(
            {"messages": [system], "turn": 0, "stop": turns - 1}, config, durability=durability
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


def run_case(
    who: str, turns: int, parent: str | None, before: str | None, cap: float | None = None
) -> dict[str, Any] | None:
    """Both phases in child processes; None when a phase ran over ``cap`` seconds."""
    directory = Path(tempfile.mkdtemp(prefix="crashproof-transcript-", dir=parent))
    env = dict(os.environ)
    if who in ("before", "whole-before"):
        env["PYTHONPATH"] = before or ""
    out: dict[str, Any] = {}
    try:
        for phase in ("live", "resume"):
            argv = [sys.executable, __file__, "--child", who, str(turns), str(directory), phase]
            try:
                done = subprocess.run(
                    argv, env=env, capture_output=True, text=True, check=False, timeout=cap
                )
            except subprocess.TimeoutExpired:
                return None
            if phase == "live" and done.returncode == -signal.SIGKILL:
                out.update(json.loads((directory / "live.json").read_text()))
                continue
            if done.returncode != 0:
                raise SystemExit(f"{who} T={turns} {phase} failed:\n{done.stderr[-3000:]}")
            out.update(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def _phase(
    who: str, turns: int, directory: Path, phase: str, before: str | None = None
) -> dict[str, Any]:
    """One phase in a child process: its JSON line (live: {} once it was SIGKILLed).
    ``before``: the ``src`` the "before" contestants import crashproof from."""
    argv = [sys.executable, __file__, "--child", who, str(turns), str(directory), phase]
    env = dict(os.environ)
    if who.startswith("before"):
        env["PYTHONPATH"] = before or ""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if phase == "live" and done.returncode == -signal.SIGKILL:
        return {}
    if done.returncode != 0:
        raise SystemExit(f"{who} T={turns} {phase} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def resume_rounds(
    turns: int, contestants: list[str], rounds: int, parent: str | None, before: str | None
) -> None:
    """``--rounds``: each contestant's crashed run made once, then resumed ``rounds``
    times side by side (module docstring)."""
    made: dict[str, Path] = {}
    times: dict[str, list[float]] = {who: [] for who in contestants}
    loads: list[float] = []
    scratch = Path(tempfile.mkdtemp(prefix="crashproof-rounds-", dir=parent))
    try:
        for who in contestants:
            made[who] = scratch / f"{who}-made"
            made[who].mkdir()
            _phase(who, turns, made[who], "live-exit" if who == "langgraph" else "live", before)
        for r in range(rounds):
            order = contestants[r % len(contestants) :] + contestants[: r % len(contestants)]
            for who in order:
                directory = scratch / f"{who}-{r}"
                shutil.copytree(made[who], directory)
                loads.append(os.getloadavg()[0])
                times[who].append(_phase(who, turns, directory, "resume", before)["resume_s"])
                shutil.rmtree(directory)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for who in contestants:
        t = sorted(times[who])
        line = f"{who:<19}{turns:>7}{statistics.median(t) * 1e3:>10.1f} ms"
        line += f"   ({t[0] * 1e3:.1f}-{t[-1] * 1e3:.1f})"
        if "langgraph" in times and who != "langgraph":
            ratios = [a / b for a, b in zip(times[who], times["langgraph"], strict=True)]
            line += f"   x LangGraph: {statistics.median(ratios):.2f}"
            line += f" ({min(ratios):.2f}-{max(ratios):.2f})"
        print(line, flush=True)
    print(
        f"{'':<19}{turns:>7}  load average (1 min) per resume: "
        f"{min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", default="50,200,500,1000,10000")
    parser.add_argument("--before", help="another checkout's src/ (crashproof before #22)")
    parser.add_argument("--peer-max", type=int, default=200, help="LangGraph: up to T turns")
    parser.add_argument(
        "--dbos-cap", type=float, default=600.0, help="DBOS: seconds per phase, then 'over cap'"
    )
    parser.add_argument("--dir", default=None, help="where the databases go")
    parser.add_argument(
        "--whole", action="store_true", help="also a decision returning the whole history"
    )
    parser.add_argument("--only", default=None, help="only these contestants (comma-separated)")
    parser.add_argument(
        "--rounds", type=int, default=0, help="resume only, side by side, in N rounds (#42)"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        who, turns, directory, phase = args.child
        if who == "langgraph":
            result = child_langgraph(int(turns), Path(directory), phase)
        elif who == "dbos":
            result = child_dbos(int(turns), Path(directory), phase)
        else:
            kind = {
                "transcript": "transcript",
                "before-transcript": "transcript",
                "whole": "whole",
                "whole-before": "whole",
            }
            result = child_crashproof(
                kind.get(who, "list"), int(turns), Path(directory), phase, who != "list-off"
            )
        print(json.dumps(result))
        return

    langgraph_missing = None
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError as exc:
        langgraph_missing = f"langgraph: skipped ({exc}; pip install --group bench)"
    sys.path.append(str(_HERE))
    from _common import machine_facts, print_facts

    print_facts(machine_facts(Path(args.dir or tempfile.gettempdir())))
    new_text = len(json.dumps(_user(0))) + len(json.dumps(_reply(1)))
    print(f"new text per turn: ~{new_text} bytes (user message + reply, JSON)")
    contestants = ["list", "list-off", "transcript"]
    if args.before:
        contestants.insert(0, "before")
    if args.whole:
        contestants += ["whole-before", "whole"] if args.before else ["whole"]
    if langgraph_missing:
        print(langgraph_missing)
    else:
        contestants.append("langgraph")
    try:
        import dbos  # noqa: F401

        contestants.append("dbos")
    except ImportError:
        print("dbos: skipped (pip install dbos)")
    if args.only:
        contestants = [c for c in contestants if c in args.only.split(",")]
    if args.rounds:  # "before" (a plain list) and "before-transcript": at --before's src
        if args.before:
            contestants.insert(1, "before-transcript")
        rounds_of = ("before", "before-transcript", "list", "list-off", "transcript", "langgraph")
        contestants = [c for c in contestants if c in rounds_of]
        print(f"resume to the first new step, median of {args.rounds} rounds (range)")
        for turns in [int(t) for t in args.turns.split(",")]:
            resume_rounds(turns, contestants, args.rounds, args.dir, args.before)
        return
    header = (
        f"{'contestant':<22}{'T':>7}{'µs/turn':>10}{'resume':>10}{'B/turn':>10}{'x new':>7}"
        f"{'base':>10}"
    )
    print(header)
    bases: dict[str, float] = {}  # contestant -> bytes on disk after a run of 2 turns
    for turns in [int(t) for t in args.turns.split(",")]:
        for who in contestants:
            if (
                (who == "before" and turns > BEFORE_MAX)
                or (who == "langgraph" and turns > args.peer_max)
                or (who.startswith("whole") and turns > WHOLE_MAX)
            ):
                continue
            cap = args.dbos_cap if who == "dbos" else None
            r = run_case(who, turns, args.dir, args.before, cap)
            name = {
                "before": "crashproof before #22",
                "list": "crashproof, list",
                "list-off": "list, requests off",
                "transcript": "crashproof, Transcript",
                "dbos": "DBOS Transact",
                "whole": "crashproof, whole",
                "whole-before": "whole, before",
            }.get(who, "LangGraph")
            if r is None:
                print(f"{name:<22}{turns:>7}  over cap ({cap:.0f} s per phase)", flush=True)
                continue
            if who not in bases:
                two = run_case(who, 2, args.dir, args.before, cap)
                bases[who] = 2 * two["bytes_per_turn"] if two else 0.0
            per_turn = (r["bytes_per_turn"] * turns - bases[who]) / (turns - 2)
            print(
                f"{name:<22}{turns:>7}{r['us_per_turn']:>10.0f}"
                f"{r['resume_s'] * 1e3:>8.0f}ms{per_turn:>10.0f}"
                f"{per_turn / new_text:>7.1f}{bases[who]:>10.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
