"""The agent of ``openai_agent.py`` on pydantic-ai: the same tools (``agent_tools``,
handed to ``CrashproofDurability``, which adds them to the agent with the schemas
``cp.models.tool`` derives, pydantic's, as pydantic-ai derives its own), model server
(through pydantic-ai's ``OpenAIChatModel`` on ``AsyncOpenAI``), forge and artifacts.
Each model request is a decision (``coder:model_request``, ``...#2``), each tool call a
step or its acts. ``pydantic_ai_agent_plain.py`` is the same agent without crashproof.
Needs ``crashproof[pydantic-ai]``.

    crashproof verify examples.pydantic_ai_agent:SCENARIO
    crashproof verify examples.pydantic_ai_agent:SCENARIO --mode subprocess
"""

from __future__ import annotations

from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable
from crashproof.verify import Scenario

from .openai_agent import MODEL, SYSTEM, TASK, Env, agent_tools, effects_of, fingerprint
from .openai_agent import make_env as make_openai_env
from .openai_agent_async import async_client

RUN_ID = "example:pydantic-ai-agent"
DECISIONS = "coder:model_request"  # the agent's name, then pydantic-ai's hook


def make_env(directory: Path) -> Env:
    return make_openai_env(directory, async_client, key=DECISIONS)


def make_workflow(env: Env) -> cp.Workflow[int]:
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=env.client))
    durability = CrashproofDurability(tools=agent_tools(env))
    agent = Agent(model, name="coder", instructions=SYSTEM, capabilities=[durability])

    @cp.workflow("pydantic-ai-agent", version="1")
    async def coder(ctx: cp.AsyncContext, task: str) -> int:
        with durable(ctx):
            return len((await agent.run(task)).all_messages())

    return coder


SCENARIO = Scenario(
    name="pydantic-ai-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects_of(RUN_ID, DECISIONS),
    model_calls=lambda env: env.model.calls(),
)
