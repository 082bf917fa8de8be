"""The agent of ``openai_agent.py`` on the official ``anthropic`` SDK (Messages): the
same tools (``agent_tools``, their schemas sent as Anthropic's ``input_schema``), model
server (its ``/v1/messages``), forge and artifacts. ``anthropic_agent_plain.py`` is the
same agent without crashproof.

    crashproof verify examples.anthropic_agent:SCENARIO
    crashproof verify examples.anthropic_agent:SCENARIO --mode subprocess
"""

from __future__ import annotations

from pathlib import Path

import anthropic

import crashproof as cp
from crashproof.verify import Scenario

from ._model_server import ModelServer
from .openai_agent import SYSTEM, TASK, Env, agent_tools, effects_of, fingerprint
from .openai_agent import make_env as make_openai_env

RUN_ID = "example:anthropic-agent"
MODEL = "claude-sonnet-4-5"
PRICES = {"claude-sonnet-4-5": cp.models.Price(input=3.0, output=15.0, cached_input=0.3)}


def anthropic_client(model: ModelServer) -> anthropic.Anthropic:
    http = anthropic.DefaultHttpxClient(verify=False, timeout=10.0)
    return anthropic.Anthropic(api_key="local", base_url=model.root, http_client=http)


def make_env(directory: Path) -> Env:
    return make_openai_env(directory, anthropic_client)


def make_workflow(env: Env) -> cp.Workflow[int]:
    tools = agent_tools(env)

    @cp.workflow("anthropic-agent", version="1")
    def anthropic_agent(ctx: cp.Context, task: str) -> int:
        llm = cp.models.anthropic_messages(ctx, env.client, prices=PRICES)
        messages = [{"role": "user", "content": task}]
        while True:
            reply = llm.create(
                model=MODEL, max_tokens=1024, system=SYSTEM, messages=messages, tools=tools
            )
            messages += llm.reply_messages(reply)
            if not (results := llm.run_tools(reply)):
                return len(messages)
            messages += results

    return anthropic_agent


SCENARIO = Scenario(
    name="anthropic-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects_of(RUN_ID, "message"),
    model_calls=lambda env: env.model.calls(),
)
