"""Bad input to ``cp.models.tool`` functions given to the three framework integrations
(pydantic-ai, the Agents SDK, LangGraph's prebuilt agent), against the local model
server over a real socket: a model that calls a tool that does not exist, or sends
arguments that do not fit the schema, gets a message (and the run goes on), or the run
stops with an error naming the tool; a tool's own exception is a message; a signature
that cannot become a schema is refused when the tool is defined, naming the tool and the
parameter. Never a failed run with a traceback from crashproof."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples._model_server import ModelServer  # noqa: E402

import crashproof as cp  # noqa: E402

# Turn 0: an unknown tool, arguments of the wrong type, arguments missing, a tool that
# raises; turn 1: the answer.
SCRIPT = [
    (
        "Trying things.",
        [
            ("nope", {}),
            ("read_file", {"path": 3}),
            ("read_file", {}),
            ("divide", {"a": 1, "b": 0}),
        ],
    ),
    ("Done.", []),
]


def _tools() -> list[cp.models.FunctionTool]:
    @cp.models.tool
    def read_file(path: str) -> str:
        """Read a file."""
        return f"text of {path}"

    @cp.models.tool
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    return [read_file, divide]


def test_a_signature_that_cannot_become_a_schema_names_the_tool() -> None:
    with pytest.raises(TypeError, match=r"model tool 'fetch'.*parameter 'lock'"):

        @cp.models.tool
        def fetch(url: str, lock: asyncio.Lock) -> str:
            """Fetch a page."""
            return url


class _Recording(ModelServer):
    """The model server, keeping each request's body (what the model was told)."""

    def __init__(self, script: Any, key: str = "") -> None:
        super().__init__(script, key=key)
        self.requests: list[dict[str, Any]] = []

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(body)
        return super().answer(body)


def _told(server: _Recording) -> str:
    """The tool messages of the last request, as text."""
    messages = server.requests[-1]["messages"]
    return json.dumps([m for m in messages if m.get("role") == "tool"])


def _ledger(tmp_path: Path) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path}/runs.db", key=secrets.token_bytes(32))


def test_pydantic_ai(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai")
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from crashproof.integrations.pydantic_ai import CrashproofDurability, durable

    server = _Recording(SCRIPT).start()
    try:
        client = AsyncOpenAI(api_key="k", base_url=server.url, max_retries=0)
        model = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client))
        durability = CrashproofDurability(tools=_tools())
        agent = Agent(model, name="coder", capabilities=[durability])

        @cp.workflow("bad-input-pydantic-ai")
        async def flow(ctx: cp.AsyncContext) -> str:
            with durable(ctx):
                return (await agent.run("go")).output

        with _ledger(tmp_path) as ledger:
            assert asyncio.run(ledger.run_async(flow, run_id="r")).startswith("Done.")
    finally:
        server.stop()
    told = _told(server)
    assert "nope" in told  # pydantic-ai's retry prompt names the unknown tool
    assert "do not fit its schema" in told  # the wrong type and the missing argument
    assert "ZeroDivisionError" in told


def test_openai_agents_sdk(tmp_path: Path) -> None:
    """An unknown tool is the SDK's own refusal, naming the tool (the run fails,
    recorded), unless the run asks the SDK to tell the model
    (``tool_not_found_behavior="return_error_to_model"``); the rest is a message."""
    pytest.importorskip("agents")
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    from crashproof.integrations.openai_agents import durable, durable_agent

    set_tracing_disabled(True)
    told = RunConfig(tool_not_found_behavior="return_error_to_model")

    def attempt(config: Any) -> str | None:
        """The run under ``config``: its result and what the model was told last."""
        server = _Recording(SCRIPT).start()
        try:
            client = AsyncOpenAI(api_key="k", base_url=server.url, max_retries=0)
            model = OpenAIChatCompletionsModel("m", openai_client=client)
            coder = durable_agent(Agent(name="coder", model=model), tools=_tools())

            @cp.workflow(f"bad-input-agents-{config is None}")
            async def flow(ctx: cp.AsyncContext) -> str:
                with durable(ctx):
                    result = await Runner.run(coder, "go", run_config=config)
                    return str(result.final_output)

            directory = tmp_path / str(config is None)
            directory.mkdir()
            with _ledger(directory) as ledger:
                if config is None:
                    with pytest.raises(cp.RunFailed, match="Tool nope not found in agent coder"):
                        asyncio.run(ledger.run_async(flow, run_id="r"))
                    return None
                assert asyncio.run(ledger.run_async(flow, run_id="r")).startswith("Done.")
        finally:
            server.stop()
        return _told(server)

    assert attempt(None) is None  # the SDK's default: a clear error naming the tool
    messages = attempt(told)
    assert messages is not None
    assert "nope" in messages
    assert messages.count("do not fit its schema") == 2, messages
    assert "ZeroDivisionError" in messages


def test_langgraph_prebuilt(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.prebuilt")
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    from crashproof.integrations.langgraph import (
        CrashproofSaver,
        NodeCalls,
        durable_model,
        durable_tools,
        start_or_resume,
    )

    warnings.filterwarnings("ignore", message=".*create_react_agent.*")
    server = _Recording(SCRIPT).start()
    try:
        saver = CrashproofSaver(f"sqlite:///{tmp_path}/runs.db", key=secrets.token_bytes(32))
        with saver:
            calls = NodeCalls(saver.ledger)
            model = ChatOpenAI(model="m", base_url=server.url, api_key="k", max_retries=0)
            agent = create_react_agent(
                durable_model(calls, model), durable_tools(calls, _tools()), checkpointer=saver
            )
            config = {"configurable": {"thread_id": "t"}}
            values = start_or_resume(agent, {"messages": [("user", "go")]}, config)
    finally:
        server.stop()
    assert str(values["messages"][-1].content).startswith("Done.")
    told = _told(server)
    assert "nope" in told  # ToolNode's message names the unknown tool
    assert told.count("do not fit its schema") == 2, told
    assert "ZeroDivisionError" in told
