"""The agent of ``pydantic_ai_agent.py`` without crashproof: pydantic-ai's
``OpenAIChatModel`` on ``AsyncOpenAI`` with the SDK's retries on 408/409/429/5xx raised
to 5, the tools of ``openai_agent_plain.py`` (pydantic-ai derives their schemas from
their signatures; the descriptions are the plain twin's), a tool's error returned to the
model as its output (pydantic-ai would end the run on it), and pydantic-ai's own retry
prompts for an unknown tool or arguments that do not validate."""

from __future__ import annotations

import functools
from typing import Any

import openai
from pydantic_ai import Agent, Tool
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from .openai_agent import MODEL, SYSTEM
from .openai_agent_plain import TOOLS, Tools


def _tool(tools: Tools, name: str, description: str) -> Tool[Any]:
    @functools.wraps(getattr(tools, name))  # its signature is the schema
    def call(**arguments: Any) -> str:
        return tools.call(name, arguments)  # an error: the model reads it

    return Tool(call, name=name, description=description)


async def agent(client: openai.AsyncOpenAI, tools: Tools, task: str) -> int:
    client = client.with_options(max_retries=5)  # 408, 409, 429, 5xx: with backoff
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
    functions = [_tool(tools, f["name"], f["description"]) for f in (t["function"] for t in TOOLS)]
    coder = Agent(model, name="coder", instructions=SYSTEM, tools=functions, retries=3)
    return len((await coder.run(task)).all_messages())
