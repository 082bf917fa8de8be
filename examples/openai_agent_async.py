"""The agent of ``openai_agent.py`` written async: ``async def`` workflow on
``openai.AsyncOpenAI``, the same tools (``agent_tools``: the sync ``Workspace``,
``GitTool``, ``HttpTool`` and outbox run in worker threads), model server, forge and
artifacts. ``openai_agent_async_plain.py`` is the same agent without crashproof.

    crashproof verify examples.openai_agent_async:SCENARIO
    crashproof verify examples.openai_agent_async:SCENARIO --mode subprocess
"""

from __future__ import annotations

from pathlib import Path

import openai

import crashproof as cp
from crashproof.verify import Scenario

from ._model_server import ModelServer
from .openai_agent import MODEL, PRICES, SYSTEM, TASK, Env, agent_tools, effects_of, fingerprint
from .openai_agent import make_env as make_sync_env

RUN_ID = "example:openai-agent-async"


def async_client(model: ModelServer) -> openai.AsyncOpenAI:
    http = openai.DefaultAsyncHttpxClient(verify=False, timeout=10.0)
    return openai.AsyncOpenAI(api_key="local", base_url=model.url, http_client=http)


def make_env(directory: Path) -> Env:
    return make_sync_env(directory, async_client)


def make_workflow(env: Env) -> cp.Workflow[int]:
    tools = agent_tools(env)

    @cp.workflow("openai-agent-async", version="1")
    async def openai_agent(ctx: cp.AsyncContext, task: str) -> int:
        llm = cp.models.openai_chat(ctx, env.client, prices=PRICES)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        while True:
            reply = await llm.create(model=MODEL, messages=messages, tools=tools)
            messages += llm.reply_messages(reply)
            if not (results := await llm.run_tools(reply)):
                return len(messages)
            messages += results

    return openai_agent


SCENARIO = Scenario(
    name="openai-agent-async",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects_of(RUN_ID, "chat"),
    model_calls=lambda env: env.model.calls(),
)
