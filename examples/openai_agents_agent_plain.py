"""The agent of ``openai_agents_agent.py`` without crashproof: the SDK's
``OpenAIChatCompletionsModel`` on ``AsyncOpenAI`` with the SDK's retries on
408/409/429/5xx raised to 5, the tools of ``openai_agent_plain.py`` as the SDK's
function tools (their schemas derived from their signatures, the descriptions the
plain twin's), a tool's error returned to the model by the SDK's default
``failure_error_function``."""

from __future__ import annotations

import openai
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

from .openai_agent import MODEL, SYSTEM
from .openai_agent_plain import TOOLS, Tools


async def agent(client: openai.AsyncOpenAI, tools: Tools, task: str) -> int:
    set_tracing_disabled(True)  # no trace exporter: the model server is local
    client = client.with_options(max_retries=5)  # 408, 409, 429, 5xx: with backoff
    model = OpenAIChatCompletionsModel(MODEL, openai_client=client)
    functions = [  # the SDK derives each schema from the method's signature
        function_tool(getattr(tools, f["name"]), description_override=f["description"])
        for f in (t["function"] for t in TOOLS)
    ]
    coder = Agent(name="coder", instructions=SYSTEM, model=model, tools=functions)
    return len((await Runner.run(coder, task, max_turns=20)).to_input_list())
