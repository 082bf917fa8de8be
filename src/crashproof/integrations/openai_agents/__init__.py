"""The OpenAI Agents SDK on crashproof (extra ``crashproof[openai-agents]``).

::

    from crashproof.integrations.openai_agents import durable, durable_agent

    agent = durable_agent(Agent(name="fixer", model="gpt-4.1", tools=[...]),
                          tools={"open_pr": forge}, effects={"post_comment"})

    @ledger.workflow("fix", version="1")
    async def fix(ctx: cp.AsyncContext, issue: str) -> str:
        with durable(ctx):
            return (await Runner.run(agent, issue)).final_output

Each model call is a decision (``<name>``, ``<name>#2``, ...), each function tool call
a step or an act keyed by the model call that made it and its index. Only
``crashproof``'s public names are used here; ``import crashproof`` never imports the SDK.
"""

from crashproof.integrations.openai_agents._agent import durable_agent
from crashproof.integrations.openai_agents._bridge import durable
from crashproof.integrations.openai_agents._model import (
    RETRY,
    CrashproofModel,
    CrashproofModelProvider,
)

__all__ = ["RETRY", "CrashproofModel", "CrashproofModelProvider", "durable", "durable_agent"]
