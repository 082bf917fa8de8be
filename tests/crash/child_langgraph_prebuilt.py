"""A child process for the LangGraph prebuilt crash test: ``create_react_agent`` on
CrashproofSaver, its model a real ``ChatOpenAI`` (wrapped by ``durable_model``) against
the local model server, its tools wrapped by ``durable_tools``: ``search`` a recorded
read, ``open_issue`` an act on an HttpTool against a local IdempotentServer. The graph
is consumed as a stream (``stream_mode=["updates", "messages"]``: the model's tokens and
each node's update) and resumed with ``resume_stream``.

Usage: python child_langgraph_prebuilt.py LEDGER_URL DIR MODEL_URL TARGET_URL SPEC
SPEC: ``none`` | ``count`` (none, and the crash points passed go to DIR/counts.json) |
``ledger:N`` (SIGKILL at the ledger's N-th crash point) |
``saver:N`` (SIGKILL right after the saver's N-th write, a put or a put_writes) |
``stream:N`` (SIGKILL while consuming the stream's N-th event).
Writes DIR/final.json (the thread's messages, the model's nonces left out) and
DIR/events.json (the kinds of the events this process consumed).

    python child_langgraph_prebuilt.py serve

reads one JSON line of those arguments at a time and runs each in a process forked
from this one, which imported LangGraph and LangChain once, and answers with the forked
process's exit code (-9: killed by SIGKILL).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

import crashproof as cp
from crashproof.integrations.langgraph import (
    CrashproofSaver,
    NodeCalls,
    durable_model,
    durable_tools,
    resume_stream,
    unfinished,
)
from crashproof.tools.http import HttpTool

warnings.filterwarnings("ignore", category=DeprecationWarning)
THREAD = {"configurable": {"thread_id": "agent-1"}}
MODES = ["updates", "messages"]


class KillingSaver(CrashproofSaver):
    """A CrashproofSaver whose process dies right after its ``at``-th write."""

    at = 0
    writes = 0

    def _wrote(self) -> None:
        KillingSaver.writes += 1
        if KillingSaver.writes == self.at:
            os.kill(os.getpid(), signal.SIGKILL)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        result = super().put(*args, **kwargs)
        self._wrote()
        return result

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        super().put_writes(*args, **kwargs)
        self._wrote()


def search(query: str) -> str:
    """Search the tracker for issues matching the query."""
    return f"no issue matches {query!r}"


def open_issue(title: str, body: str = "") -> dict[str, Any]:
    """Open an issue in the tracker."""
    raise RuntimeError("performed by the forge act, never called")  # pragma: no cover


def build(saver: CrashproofSaver, model_url: str, target: str) -> Any:
    calls = NodeCalls(saver.ledger)
    forge = HttpTool(target, "/resources", lookup_path="/resources/by-key/{operation_id}")
    model = ChatOpenAI(model="gpt-test", base_url=model_url + "/v1", api_key="k", max_retries=0)
    tools = durable_tools(
        calls,
        [search, open_issue],
        reads={"search"},
        acts={"open_issue": forge},
        params={"open_issue": lambda args: {"body": args}},
    )
    return create_react_agent(durable_model(calls, model), tools, checkpointer=saver)


_NONCE = re.compile(r"\s*\[[0-9a-f]{12}\]")


def shown(messages: list[Any]) -> list[list[Any]]:
    """The messages without what differs between two askings of the model (nonces)."""
    out = []
    for m in messages:
        content = m.content if isinstance(m.content, str) else json.dumps(m.content)
        if m.type == "tool":
            body = json.loads(content) if content.startswith("{") else content
            content = body.get("body") if isinstance(body, dict) else body  # not the key
        calls = [[c["name"], c["args"]] for c in getattr(m, "tool_calls", None) or []]
        out.append(
            [m.type, _NONCE.sub("", content) if isinstance(content, str) else content, calls]
        )
    return out


def drive(graph: Any, spec: str, directory: Path) -> None:
    """Start the thread (as a stream), or finish what a crash stopped."""
    kill_at = int(spec[7:]) if spec.startswith("stream:") else 0
    if graph.get_state(THREAD).created_at is None:
        inputs = {"messages": [HumanMessage("file a bug about the flaky test")]}
        events = graph.stream(inputs, THREAD, stream_mode=MODES, durability="sync")
    else:
        state = graph.get_state(THREAD)
        # What the usual `if state.next:` test would have concluded, for the test to see.
        (directory / "resumed.json").write_text(
            json.dumps({"next": list(state.next), "unfinished": unfinished(state)})
        )
        events = resume_stream(graph, THREAD, stream_mode=MODES, durability="sync")
    seen = []
    for n, (mode, _) in enumerate(events, start=1):
        seen.append(mode)
        if n == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    (directory / "events.json").write_text(json.dumps(seen))


def main(url: str, directory: Path, model_url: str, target: str, spec: str) -> None:
    points = cp.CrashPoints() if spec == "count" else None
    if spec.startswith("ledger:"):
        points = cp.CrashPoints(at=int(spec[7:]), action="sigkill")
    ledger = cp.Ledger(url, crash_points=points)
    KillingSaver.at = int(spec[6:]) if spec.startswith("saver:") else 0
    KillingSaver.writes = 0
    with KillingSaver(ledger=ledger) as saver:
        graph = build(saver, model_url, target)
        drive(graph, spec, directory)
        final = graph.get_state(THREAD).values["messages"]
    ledger.close()
    (directory / "final.json").write_text(json.dumps(shown(final)))
    (directory / "raw.json").write_text(json.dumps([str(m.content) for m in final]))
    (directory / "counts.json").write_text(
        json.dumps({"writes": KillingSaver.writes, "points": points.passed if points else []})
    )


def serve() -> None:
    for line in sys.stdin:
        args = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the crash point's own process: it dies, or ends, here
            code = 1
            try:
                main(args[0], Path(args[1]), args[2], args[3], args[4])
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
        main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
