"""The agents the pydantic-ai tests share: a ``FunctionModel`` that makes two requests
(the first calls the tools, the second answers) and counts what it is asked, a plain
function tool, a tool marked as an effect and a ``cp.Tool`` with lookup. Targets keep
their effects in files, so a killed child's effects are still counted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable, effect


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class Forge(cp.Tool):
    """Opens PRs kept in a JSON file by operation id; looks them up by it."""

    name: ClassVar[str] = "forge"
    version: ClassVar[str] = "1"

    def __init__(self, path: Path) -> None:
        self.path = path

    def _prs(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}  # type: ignore[no-any-return]

    def execute(self, call: cp.Call) -> cp.Receipt:
        prs = self._prs()
        pr = prs.setdefault(
            call.operation_id,
            {"n": len(prs) + 1, "title": call.params["title"], "digest": call.intent_digest},
        )
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps(prs))
        temp.replace(self.path)
        call.crash_point("opened")
        return cp.Receipt(str(pr["n"]), {"pr": pr["n"]}, pr["digest"])

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        pr = self._prs().get(call.operation_id)
        return None if pr is None else cp.Receipt(str(pr["n"]), {"pr": pr["n"]}, pr["digest"])


def make_agent(
    directory: Path,
    *,
    crash_on_request: int | None = None,
    functions: str = "step",
    note: str = "review",
) -> Agent[None, str]:
    """``adder``: request 1 calls ``add(x=5)``, ``note(text="hi")`` (an effect whose
    unknown outcome means ``note``, a ``cp.OnUnknown``) and ``open_pr(title="fix")``
    (the forge); request 2 answers. Each request the model receives is logged in
    ``asked`` (its number of messages); ``crash_on_request=n`` raises
    ``cp.SimulatedCrash`` inside the n-th request, once. The note's target dedupes by
    its text: every send is in ``effects``, each text delivered once in ``delivered``."""
    asked, effects = directory / "asked", directory / "effects"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        _append(asked, str(len(messages)))
        if crash_on_request == len(lines(asked)):
            raise cp.SimulatedCrash("inside the model request")
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("add", {"x": 5}, tool_call_id="call-add"),
                    ToolCallPart("note", {"text": "hi"}, tool_call_id="call-note"),
                    ToolCallPart("open_pr", {"title": "fix"}, tool_call_id="call-pr"),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    durability = CrashproofDurability(
        tools={"open_pr": Forge(directory / "prs.json")},
        functions="effect" if functions == "effect" else "step",
    )
    agent = Agent(FunctionModel(model), name="adder", capabilities=[durability])

    @agent.tool_plain
    def add(x: int) -> int:
        """Add one, and count it."""
        _append(effects, str(x))
        return x + 1

    @agent.tool_plain(metadata=effect(note))
    def note(text: str) -> str:
        """Write a note (an effect without lookup)."""
        _append(effects, text)
        if text not in lines(directory / "delivered"):
            _append(directory / "delivered", text)
        return "noted"

    @agent.tool_plain
    def open_pr(title: str) -> str:
        """Open a PR (performed by the forge: this body is never called)."""
        raise AssertionError("the forge performs open_pr")

    return agent


def workflow(ledger: cp.Ledger, agent: Agent[None, str], mode: str) -> cp.Workflow[Any]:
    """The agent run in a sync (``agent.run_sync``) or async (``await agent.run``)
    workflow, registered under one name: they write the same journal, so either may
    resume the other's run."""

    def sync(ctx: cp.Context, prompt: str) -> str:
        with durable(ctx):
            return agent.run_sync(prompt).output

    async def async_(ctx: cp.AsyncContext, prompt: str) -> str:
        with durable(ctx):
            return (await agent.run(prompt)).output

    return ledger.workflow("agent", version="1")(sync if mode == "sync" else async_)


def drive(ledger: cp.Ledger, wf: cp.Workflow[Any], mode: str, **kw: Any) -> Any:
    """Start or resume run ``r`` in ``mode``."""
    if mode == "async":
        return asyncio.run(ledger.run_async(wf, run_id="r", **kw))
    return ledger.run(wf, run_id="r", **kw)
