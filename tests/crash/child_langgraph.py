"""A child process for the LangGraph crash test: a two-turn agent graph on
CrashproofSaver whose model call is a NodeCalls decision and whose tool call is a
NodeCalls act on an HttpTool against a local IdempotentServer.

Usage: python child_langgraph.py LEDGER_URL DIR TARGET_URL SPEC   (SPEC: none | at:N)
TARGET_URL ``note:MEANING`` calls a plain function without lookup instead (its unknown
outcome means MEANING, a ``cp.OnUnknown``): every send goes to DIR/effects, and its
target dedupes by text into DIR/delivered.
Every model call appends "model" to DIR/counts (it survives SIGKILL); the final state's
messages are written to DIR/final.json.

    python child_langgraph.py serve

reads one JSON line [LEDGER_URL, DIR, TARGET_URL, SPEC] at a time and runs each in a
process forked from this one, which has imported LangGraph already (1.5-3 s a process
on the 2-core machine, most of a crash point's cost), and answers each with the forked
process's exit code (-9: killed by SIGKILL). It runs no thread of its own, so the fork
is safe; the random module reseeds in every forked process.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import crashproof as cp
from crashproof.integrations.langgraph import CrashproofSaver, FunctionTool, NodeCalls
from crashproof.tools.http import HttpTool

THREAD = {"configurable": {"thread_id": "chat-1"}}


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build(saver: CrashproofSaver, directory: Path, target: str) -> Any:
    calls = NodeCalls(saver.ledger)
    forge = None
    if not target.startswith("note:"):
        forge = HttpTool(target, "/resources", lookup_path="/resources/by-key/{operation_id}")

    def model(turn: int) -> dict[str, Any]:  # a fake model: counted, deterministic
        with (directory / "counts").open("a") as f:
            f.write("model\n")
        if turn == 0:
            return {"text": "", "call": {"name": "create", "args": {"title": "x"}, "id": "c1"}}
        return {"text": "created", "call": None}

    def agent(state: State, config: RunnableConfig) -> dict[str, Any]:
        turns = sum(isinstance(m, ToolMessage) for m in state["messages"])
        answer = calls.decide(config, f"model-{turns}", model, turn=turns)
        tool_calls = [answer["call"]] if answer["call"] else []
        return {"messages": [AIMessage(answer["text"], tool_calls=tool_calls)]}

    def note(title: str) -> dict[str, Any]:  # an effect without lookup
        with (directory / "effects").open("a") as f:
            f.write(title + "\n")
        delivered = directory / "delivered"
        if title not in (delivered.read_text().split() if delivered.exists() else []):
            with delivered.open("a") as f:
                f.write(title + "\n")
        return {"id": 1, "body": {"title": title}}

    def tools(state: State, config: RunnableConfig) -> dict[str, Any]:
        last = state["messages"][-1]
        out = []
        for call in getattr(last, "tool_calls", []):
            if forge is None:
                tool = FunctionTool(note, on_unknown=target[5:])
                try:
                    result = calls.act(config, call["id"], tool, **call["args"])
                except cp.ActNotDone:
                    result = {"id": 0, "body": "not done"}
            else:
                result = calls.act(config, call["id"], forge, body=call["args"])
            shown = {"id": result["id"], "body": result["body"]}  # not the key: ids vary
            out.append(ToolMessage(json.dumps(shown, sort_keys=True), tool_call_id=call["id"]))
        return {"messages": out}

    def route(state: State) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def drive(graph: Any) -> list[list[str]]:
    """Start the thread, or go on from its last checkpoint."""
    state = graph.get_state(THREAD)
    if not state.values:
        graph.invoke({"messages": [HumanMessage("open an issue")]}, THREAD, durability="sync")
    elif state.next:
        graph.invoke(None, THREAD, durability="sync")
    final = graph.get_state(THREAD).values["messages"]
    return [[m.type, str(m.content)] for m in final]


def main(url: str, directory: Path, target: str, spec: str) -> None:
    points = cp.CrashPoints(at=int(spec[3:]), action="sigkill") if spec != "none" else None
    ledger = cp.Ledger(url, crash_points=points)
    with CrashproofSaver(ledger=ledger) as saver:
        messages = drive(build(saver, directory, target))
    ledger.close()
    (directory / "final.json").write_text(json.dumps(messages))


def serve() -> None:
    for line in sys.stdin:
        url, directory, target, spec = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the crash point's own process: it dies, or ends, here
            code = 1
            try:
                main(url, Path(directory), target, spec)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4])
