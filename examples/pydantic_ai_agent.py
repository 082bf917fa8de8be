"""A pydantic-ai agent under ``CrashproofDurability``, as a verifier scenario: two model
requests (a ``FunctionModel`` that logs every request it answers), a workspace append
performed by ``cp.Workspace`` as an act, and a check as a step. Needs
``crashproof[pydantic-ai]``.

    crashproof verify examples.pydantic_ai_agent:SCENARIO
    crashproof verify examples.pydantic_ai_agent:SCENARIO --mode subprocess
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable
from crashproof.verify import Scenario

RUN_ID = "verify:pydantic-ai-agent"
NOTE = "+fixed the greeting\n"


@dataclass
class Env:
    workspace: cp.Workspace
    log: Path
    agent: Agent[None, str]


def make_env(directory: Path) -> Env:
    """A fresh environment in an empty directory; after a crash, the one left there."""
    (directory / "ws").mkdir(exist_ok=True)
    workspace, log = cp.Workspace(directory / "ws"), directory / "model.log"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        with log.open("a", encoding="utf-8") as f:
            f.write(f"request-{len(messages)}\n")
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("append", {"op": "append", "path": "CHANGES", "text": NOTE}),
                    ToolCallPart("check", {"path": "CHANGES"}),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    durability = CrashproofDurability(tools={"append": workspace})
    agent = Agent(FunctionModel(model), name="fixer", capabilities=[durability])

    @agent.tool_plain
    def append(op: str, path: str, text: str) -> str:
        """Append text to a file (performed by the workspace)."""
        raise AssertionError("the workspace performs append")

    @agent.tool_plain
    def check(path: str) -> str:
        """How long a file is."""
        return f"{path}: {len((workspace.root / path).read_text())} bytes"

    return Env(workspace, log, agent)


def make_workflow(env: Env) -> cp.Workflow[dict[str, Any]]:
    @cp.workflow("pydantic-ai-agent", version="1")
    def fixer(ctx: cp.Context, task: str) -> dict[str, Any]:
        with durable(ctx):
            output = env.agent.run_sync(task).output
        return {"output": output, "fingerprint": env.workspace.fingerprint()}

    return fixer


def effects(env: Env) -> dict[str, int]:
    """The note, counted in the file itself: how often the append landed."""
    path = env.workspace.root / "CHANGES"
    landed = path.read_text().count(NOTE) if path.exists() else 0
    return {f"{RUN_ID}/fixer:model_request/0:append": landed} if landed else {}


def model_calls(env: Env) -> dict[str, int]:
    return dict(Counter(env.log.read_text().split())) if env.log.exists() else {}


SCENARIO = Scenario(
    name="pydantic-ai-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=lambda env: env.workspace.fingerprint(),
    inputs={"task": "fix the greeting"},
    run_id=RUN_ID,
    effects=effects,
    model_calls=model_calls,
)
