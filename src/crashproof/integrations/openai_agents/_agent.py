"""``durable_agent``: a copy of an Agents SDK agent (and of the agents it hands off to)
whose model is a ``CrashproofModel`` and whose function tools are journaled."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agents import Agent
from agents.models.interface import Model
from agents.tool import FunctionTool

import crashproof as cp
from crashproof.integrations.openai_agents._model import RETRY, CrashproofModel
from crashproof.integrations.openai_agents._tools import journaled, model_tool
from crashproof.models import FunctionTool as ModelTool

__all__ = ["durable_agent"]


def _model(agent: Agent[Any], name: str, options: cp.StepOptions) -> CrashproofModel:
    model = agent.model
    if isinstance(model, CrashproofModel):
        return model
    if isinstance(model, str) or model is None:
        from agents.models.multi_provider import MultiProvider

        model_name = model or ""
        inner: Model = MultiProvider().get_model(model or None)
        model_name = model_name or str(getattr(inner, "model", "") or "")
    else:
        inner, model_name = model, str(getattr(model, "model", "") or "")
    if not model_name:
        raise cp.CrashproofError(
            f"agent {agent.name!r}: its model {type(inner).__name__} names no model, so a "
            "recorded call could not be matched to it on resume; nothing was sent"
        )
    return CrashproofModel(inner, name=name, model_name=model_name, options=options)


def durable_agent(
    agent: Agent[Any],
    *,
    tools: Mapping[str, cp.Tool] | Sequence[ModelTool] | None = None,
    effects: Collection[str] | Mapping[str, cp.OnUnknown | str] = (),
    options: cp.StepOptions | None = None,
) -> Agent[Any]:
    """``agent`` with each model call a decision named ``<agent name>:model`` and each
    function tool journaled: a name in ``tools`` performed by that ``cp.Tool`` as an
    act (or ``tools`` a list of ``cp.models.tool`` functions: added to the agent's
    tools, each run as it declares, a wrong call or a tool's error a message to the
    model), a name in ``effects`` an act without lookup, any other a step. ``effects`` as
    a mapping says per tool what an unknown outcome means (``cp.OnUnknown``; a crash
    between the effect and its receipt): ``{"post": cp.OnUnknown.AT_LEAST_ONCE}``; a
    plain collection means ``review`` for each. Agents it hands off to are made durable
    the same way."""
    if not agent.name or "#" in agent.name:
        raise cp.CrashproofError(
            f"durable_agent needs a named agent without '#', not {agent.name!r}: the name "
            "is part of every journaled step"
        )
    added: list[FunctionTool] = []
    if isinstance(tools, Mapping):
        for key, tool in tools.items():
            if not isinstance(tool, cp.Tool):
                raise TypeError(f"durable_agent: tools[{key!r}] is not a cp.Tool")
    else:
        for item in tools or ():
            if not isinstance(item, ModelTool):
                raise TypeError(
                    f"durable_agent: a list of tools holds cp.models.tool functions, not "
                    f"{item!r}; map a tool's name to a cp.Tool in a dict instead"
                )
            added.append(model_tool(item))
    names = [t.name for t in agent.tools if isinstance(t, FunctionTool)] + [t.name for t in added]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"durable_agent: two tools are named {twice[0]!r}")
    opts = options if options is not None else cp.StepOptions(retry=RETRY)
    acts = dict(tools) if isinstance(tools, Mapping) else {}
    marked = (
        {name: cp.OnUnknown(m) for name, m in effects.items()}
        if isinstance(effects, Mapping)
        else dict.fromkeys(effects, cp.OnUnknown.REVIEW)
    )
    wrapped = [
        journaled(t, acts, marked) if isinstance(t, FunctionTool) else t for t in agent.tools
    ] + added
    handoffs = [
        durable_agent(h, tools=acts, effects=marked, options=opts) if isinstance(h, Agent) else h
        for h in agent.handoffs
    ]
    return agent.clone(
        model=_model(agent, f"{agent.name}:model", opts), tools=wrapped, handoffs=handoffs
    )
