"""An agent whose tools come from a real MCP server (``mcp_server.py``, a stdio child
started by pydantic-ai's ``MCPToolset``): request 1 calls ``bump(by=3)`` (a side effect,
counted in ``effects``) and ``double(n=4)`` (pure); request 2 answers with the tools it
was offered. Everything the server is asked lands in ``server.log``; every request the
model receives in ``asked`` (its number of messages and offered tool names)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import EFFECT, CrashproofDurability

SERVER = Path(__file__).parent / "mcp_server.py"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def server(
    directory: Path, *, id: str = "counter", extra: bool = False, **kw: Any
) -> MCPToolset[None]:
    """The stdio MCP server, logging into ``directory``."""
    env = {
        **os.environ,
        "MCP_LOG": str(directory / "server.log"),
        "MCP_EFFECTS": str(directory / "effects"),
        "MCP_EXTRA": "1" if extra else "0",
    }
    return MCPToolset(StdioTransport(sys.executable, [str(SERVER)], env=env), id=id, **kw)


def make_agent(
    directory: Path,
    *,
    crash_on_request: int | None = None,
    effect: bool = False,
    functions: str = "step",
    toolset: Any = None,
    more: tuple[Any, ...] = (),
) -> Agent[None, str]:
    """``counter``: see the module's docstring. ``effect=True`` marks the server's
    tools ``EFFECT``; ``more``: toolsets after it; ``crash_on_request=n`` raises
    ``cp.SimulatedCrash`` inside the n-th request, once."""
    asked = directory / "asked"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tools = ",".join(sorted(t.name for t in info.function_tools))
        with asked.open("a") as f:
            f.write(f"{len(messages)} {tools}\n")
        if crash_on_request == len(lines(asked)):
            raise cp.SimulatedCrash("inside the model request")
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("bump", {"by": 3}, tool_call_id="call-bump"),
                    ToolCallPart("double", {"n": 4}, tool_call_id="call-double"),
                ]
            )
        return ModelResponse(parts=[TextPart(f"done with {tools}")])

    mcp = toolset if toolset is not None else server(directory)
    if effect:
        mcp = mcp.with_metadata(**EFFECT)
    durability = CrashproofDurability(functions="effect" if functions == "effect" else "step")
    return Agent(
        FunctionModel(model), name="counter", toolsets=[mcp, *more], capabilities=[durability]
    )
