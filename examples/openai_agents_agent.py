"""The agent of ``openai_agent.py`` on the OpenAI Agents SDK: the same tools
(``agent_tools``, added to the agent by ``durable_agent`` with the schemas
``cp.models.tool`` derives, pydantic's, as the SDK derives its own), model server
(through the SDK's ``OpenAIChatCompletionsModel`` on ``AsyncOpenAI``), forge and
artifacts. Each model call is a decision (``coder:model``, ``coder:model#2``, ...),
each tool call a step or its acts. ``openai_agents_agent_plain.py`` is the same agent
without crashproof. Needs ``crashproof[openai-agents]``.

    crashproof verify examples.openai_agents_agent:SCENARIO
    crashproof verify examples.openai_agents_agent:SCENARIO --mode subprocess
"""

from __future__ import annotations

from pathlib import Path

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

import crashproof as cp
from crashproof.integrations.openai_agents import durable, durable_agent
from crashproof.verify import Scenario

from .openai_agent import MODEL, SYSTEM, TASK, Env, agent_tools, effects_of, fingerprint
from .openai_agent import make_env as make_openai_env
from .openai_agent_async import async_client

RUN_ID = "example:openai-agents-agent"
DECISIONS = "coder:model"  # the agent's name, then the SDK's model call


def make_env(directory: Path) -> Env:
    return make_openai_env(directory, async_client, key=DECISIONS)


def make_workflow(env: Env) -> cp.Workflow[int]:
    set_tracing_disabled(True)  # no trace exporter: the model server is local
    model = OpenAIChatCompletionsModel(MODEL, openai_client=env.client)
    agent = Agent(name="coder", instructions=SYSTEM, model=model)
    coder = durable_agent(agent, tools=agent_tools(env))

    @cp.workflow("openai-agents-agent", version="1")
    async def openai_agents_agent(ctx: cp.AsyncContext, task: str) -> int:
        with durable(ctx):
            return len((await Runner.run(coder, task, max_turns=20)).to_input_list())

    return openai_agents_agent


SCENARIO = Scenario(
    name="openai-agents-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects_of(RUN_ID, DECISIONS),
    model_calls=lambda env: env.model.calls(),
)
