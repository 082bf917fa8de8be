"""The agent the approval tests share: ``janitor``'s first model request calls
``delete(path="a")``, a tool that requires approval; the second answers with what the
tool returned, so a test sees that the model got the tool's result. Effects and the
requests the model receives are kept in files, so a killed child's are still counted."""

from __future__ import annotations

from pathlib import Path

from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import APPROVAL_TOOL, CrashproofDurability

from .pyd_agents import _append, lines

#: The step key the run waits on: the tool call's own key.
DELETE = "janitor:model_request/0:delete"

POLICY = cp.Policy(
    "agents-approvals-1",
    allow={APPROVAL_TOOL: "1"},
    risk={APPROVAL_TOOL: "high"},
    approval_required={"high"},
)
OPTIONS = cp.RunOptions(policy=POLICY)


def make_janitor(
    directory: Path,
    *,
    raising: bool = False,
    crash_after_effect: bool = False,
    paths: tuple[str, ...] = ("a",),
) -> Agent[None, str]:
    """``paths``: the first request calls ``delete`` once for each; ``raising``: the
    tool raises ``ApprovalRequired`` itself until approved, instead of being declared
    ``requires_approval=True``; ``crash_after_effect``: the tool raises
    ``cp.SimulatedCrash`` after its effect, before it returns (the first time)."""
    asked, effects = directory / "asked", directory / "effects"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        _append(asked, str(len(messages)))
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("delete", {"path": path}, tool_call_id=f"d{i}")
                    for i, path in enumerate(paths, start=1)
                ]
            )
        last = messages[-1]
        seen = [
            str(p.content)
            for p in (last.parts if isinstance(last, ModelRequest) else [])
            if isinstance(p, ToolReturnPart)
        ]
        return ModelResponse(parts=[TextPart(f"model saw: {'; '.join(seen)}")])

    agent = Agent(FunctionModel(model), name="janitor", capabilities=[CrashproofDurability()])

    def delete_body(path: str) -> str:
        _append(effects, path)
        if crash_after_effect and len(lines(effects)) == 1:
            raise cp.SimulatedCrash("after the tool's effect, before its receipt")
        return f"deleted {path}"

    if raising:

        @agent.tool
        def delete(ctx: RunContext[None], path: str) -> str:
            """Delete a file (asks for approval itself)."""
            if not ctx.tool_call_approved:
                raise ApprovalRequired(metadata={"why": "deletes"})
            return delete_body(path)

    else:

        @agent.tool_plain(requires_approval=True)
        def delete(path: str) -> str:
            """Delete a file."""
            return delete_body(path)

    return agent
