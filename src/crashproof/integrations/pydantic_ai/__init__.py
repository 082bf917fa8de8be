"""pydantic-ai on crashproof (extra ``crashproof[pydantic-ai]``).

``CrashproofDurability`` is a pydantic-ai capability, attached as pydantic-ai's own
durability engines are (``Agent(..., name=..., capabilities=[CrashproofDurability()])``);
``durable(ctx)`` binds the agent runs inside it to a crashproof workflow's run::

    import crashproof as cp
    from crashproof.integrations.pydantic_ai import EFFECT, CrashproofDurability, durable

    durability = CrashproofDurability(tools={"open_pr": forge})
    agent = Agent(model, name="fixer", capabilities=[durability])

    @ledger.workflow("fix", version="1")
    def fix(ctx: cp.Context, issue: str) -> str:
        with durable(ctx):
            return agent.run_sync(issue).output

Each model request is a decision (never asked again once recorded), each tool call a
step or an act (see ``_capability.py``). Only ``crashproof``'s public names are used
here; ``import crashproof`` never imports pydantic-ai.
"""

from crashproof.integrations.pydantic_ai._approvals import APPROVAL_TOOL
from crashproof.integrations.pydantic_ai._bridge import durable
from crashproof.integrations.pydantic_ai._capability import (
    EFFECT,
    MODEL_RETRY,
    STEP,
    CrashproofDurability,
    effect,
)
from crashproof.integrations.pydantic_ai._codec import VOLATILE

__all__ = [
    "APPROVAL_TOOL",
    "EFFECT",
    "MODEL_RETRY",
    "STEP",
    "VOLATILE",
    "CrashproofDurability",
    "durable",
    "effect",
]
