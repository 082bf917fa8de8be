"""LangGraph's prebuilt parts on crashproof: ``create_react_agent`` / ``ToolNode`` fed by
``durable_tools`` and ``durable_model`` (a real ``ChatOpenAI`` against the local model
server), and ``resume``, which finishes a thread whose ``state.next`` is empty after a
crash. The SIGKILL matrix is tests/crash/test_sigkill_langgraph_prebuilt.py."""

from __future__ import annotations

import asyncio
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt")
pytest.importorskip("langchain_openai")

from langchain_core.messages import HumanMessage
from langchain_core.tools import ToolException
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import ToolNode, create_react_agent

from crashproof.integrations.langgraph import (
    CrashproofSaver,
    NodeCalls,
    aresume_stream,
    durable_model,
    durable_tools,
    start_or_resume,
)

sys.path.insert(0, str(Path(__file__).parents[2] / "models"))
from model_server import ModelServer, Turn

warnings.filterwarnings("ignore", category=DeprecationWarning)
THREAD = {"configurable": {"thread_id": "t"}}


class Tracker:
    """Two tools with an effect counter: ``open_issue`` (an effect), ``search`` (a read)."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.searched = 0

    def tools(self) -> list[Any]:
        def search(query: str) -> str:
            """Search issues."""
            self.searched += 1
            return f"nothing about {query}"

        def open_issue(title: str) -> dict[str, Any]:
            """Open an issue."""
            if title == "boom":
                raise ValueError("the tracker refused the title")
            self.opened.append(title)
            return {"number": len(self.opened), "title": title}

        return [search, open_issue]


def _agent(saver: CrashproofSaver, url: str, tracker: Tracker, **kw: Any) -> Any:
    calls = NodeCalls(saver.ledger)
    model = ChatOpenAI(model="gpt-test", base_url=url + "/v1", api_key="k", max_retries=0)
    tools = durable_tools(calls, tracker.tools(), reads={"search"}, **kw)
    return create_react_agent(durable_model(calls, model), tools, checkpointer=saver)


def _calls(*calls: tuple[str, str]) -> Turn:
    return Turn(calls=calls)


def test_the_prebuilt_agent_runs_its_tools_once(tmp_path: Path) -> None:
    script = [_calls(("search", '{"query": "x"}'), ("open_issue", '{"title": "t"}')), Turn("ok")]
    tracker = Tracker()
    with (
        ModelServer(script=script, by_turn=True) as server,
        CrashproofSaver(f"sqlite:///{tmp_path / 'l.db'}") as saver,
    ):
        agent = _agent(saver, server.url, tracker)
        values = start_or_resume(agent, {"messages": [HumanMessage("go")]}, THREAD)
        assert [m.type for m in values["messages"]] == ["human", "ai", "tool", "tool", "ai"]
        assert tracker.opened == ["t"]
        assert tracker.searched == 1
        # Again: the thread is finished; nothing is asked or run.
        assert start_or_resume(agent, None, THREAD) == values
        runs = {r.run_id.rsplit(":", 1)[-1] for r in saver.ledger.runs()}
        assert server.count == 2
    assert tracker.opened == ["t"]
    assert sum(1 for r in runs if r.startswith("model")) == 0  # call ids: "<id>/call"
    assert len(runs) == 4  # two decisions, one read, one act


def test_a_tool_error_and_bad_arguments_reach_the_model(tmp_path: Path) -> None:
    script = [
        _calls(("open_issue", '{"title": "boom"}'), ("open_issue", '{"nope": 1}')),
        Turn("gave up"),
    ]
    tracker = Tracker()
    with (
        ModelServer(script=script, by_turn=True) as server,
        CrashproofSaver(f"sqlite:///{tmp_path / 'l.db'}") as saver,
    ):
        agent = _agent(saver, server.url, tracker)
        values = agent.invoke({"messages": [HumanMessage("go")]}, THREAD)
        error, invalid = values["messages"][2:4]
        runs = saver.ledger.runs()
    assert error.status == "error"
    assert "the tracker refused the title" in error.content
    assert invalid.status == "error"
    assert "title" in invalid.content
    assert values["messages"][-1].content.startswith("gave up")
    assert tracker.opened == []
    assert len(runs) == 3  # two decisions and the act that raised; bad arguments: none


def test_errors_raise_leaves_them_to_the_tool_node(tmp_path: Path) -> None:
    script = [_calls(("open_issue", '{"title": "boom"}')), Turn("gave up")]
    tracker = Tracker()
    with (
        ModelServer(script=script, by_turn=True) as server,
        CrashproofSaver(f"sqlite:///{tmp_path / 'l.db'}") as saver,
    ):
        calls = NodeCalls(saver.ledger)
        model = ChatOpenAI(model="m", base_url=server.url + "/v1", api_key="k")
        tools = durable_tools(calls, tracker.tools(), errors="raise")
        node = ToolNode(tools, handle_tool_errors=ToolException)  # the node decides
        agent = create_react_agent(durable_model(calls, model), node, checkpointer=saver)
        values = agent.invoke({"messages": [HumanMessage("go")]}, THREAD)
        with pytest.raises(ValueError, match="plain arguments"):
            tools[1].invoke({"title": "x"})
    error = values["messages"][2]
    assert error.status == "error"
    assert "ToolException" in error.content
    assert "refused" in error.content
    with pytest.raises(ValueError, match="no tool named"):
        durable_tools(calls, tracker.tools(), reads={"serch"})


def test_astream_and_aresume_stream(tmp_path: Path) -> None:
    script = [_calls(("open_issue", '{"title": "a"}')), Turn("done")]
    tracker = Tracker()

    async def main(saver: CrashproofSaver, url: str) -> list[str]:
        agent = _agent(saver, url, tracker)
        modes = []
        inputs = {"messages": [HumanMessage("go")]}
        async for mode, _ in agent.astream(inputs, THREAD, stream_mode=["updates", "messages"]):
            modes.append(mode)
        async for _ in aresume_stream(agent, THREAD):
            raise AssertionError("a finished thread has nothing to resume")
        state = await agent.aget_state(THREAD)
        assert state.values["messages"][-1].content.startswith("done")
        return modes

    with (
        ModelServer(script=script, by_turn=True) as server,
        CrashproofSaver(f"sqlite:///{tmp_path / 'l.db'}") as saver,
    ):
        modes = asyncio.run(main(saver, server.url))
        assert server.count == 2
    assert modes.count("updates") == 3
    assert modes.count("messages") > 3
    assert tracker.opened == ["a"]
