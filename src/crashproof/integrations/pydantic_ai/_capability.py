"""``CrashproofDurability``: a pydantic-ai capability that journals an agent's model
requests and tool calls in the crashproof run of the enclosing ``durable(ctx)`` block.

Hooks (pydantic-ai's ``AbstractCapability``):

- ``for_agent``: the agent must be named (``Agent(..., name=...)``), or a
  ``name=`` given here: the name is part of every step name and every digest.
- ``wrap_run``: a run outside ``durable(ctx)`` is refused, never silently not durable;
  inside, the run's tool calls run one at a time in the model's order (pydantic-ai's
  ``parallel_execution_mode("sequential")``, which the run body inherits), so the
  journal's order is the model's order on every drive.
- ``get_wrapper_toolset``: each MCP server (``MCPToolset``, with an ``id``) has its tool
  listing journaled as ``<agent>:mcp/<id>:list_tools`` and is entered only when asked
  live (see ``_mcp.py``); its calls are tool calls like any other.
- ``wrap_model_request``: one ``ctx.decide("<agent>:model_request", ...)``; the value is
  the ``ModelResponse``'s JSON, revived on the first run and on replay (the model is
  not called again, so no span of it is emitted again); model name and tokens go to
  the run's budget. A streamed request (``run_stream``, ``run_stream_events``,
  ``event_stream_handler=``) is the same decision: the model's stream is drained inside
  it and the whole response recorded before the consumer sees any of it (as
  pydantic-ai's DBOS and Temporal engines do); the consumer then gets it as
  pydantic-ai's replayed events (``CompletedStreamedResponse(replay_events=True)``:
  per part, a ``PartStartEvent`` and a ``PartDeltaEvent``), the same on the first run
  and on replay. The request hooks of capabilities inside this one do not run for a
  streamed request (the model is asked directly, inside the decision).
- ``wrap_tool_execute``: each call of the latest response is journaled under
  ``<decision key>/<index>:<tool>`` (``#`` written ``.``): a ``cp.Tool`` given in
  ``tools=`` as ``ctx.act`` (intent before execute, lookup before any retry, fencing
  token forwarded; the function's body is not called), a tool whose metadata says
  ``{"crashproof": "effect"}`` (``EFFECT``, or ``effect(on_unknown)``) as an act
  without lookup (a crash between its effect and its receipt is settled as its
  ``cp.OnUnknown`` says: ``review`` freezes the run for a person, ``at_least_once``
  sends again, ``at_most_once`` tells the model it was not done), any other function
  tool as ``ctx.step`` (its result recorded with the tool-call id, replayed after; like
  every step, run again if a crash lands between its effect and its record).
  ``functions="effect"`` makes every unmarked function tool an effect, and ``STEP``
  metadata a step. An act recorded as not done (``cp.ActNotDone``) reaches the model as
  the tool's output, ``"not done: ..."``, on the first run and on replay.
- ``handle_deferred_tool_calls`` (``approvals="crashproof"``, the default): a call
  pydantic-ai defers for approval (``requires_approval=True``, ``ApprovalRequired``) is
  passed on to ``wrap_tool_execute``, which performs it as an act that waits in
  ``awaiting_approval`` for a signed approval and never runs without one
  (``_approvals.py``). ``approvals="pydantic_ai"``: pydantic-ai's own loop (the run ends
  with ``DeferredToolRequests``; an approved call is journaled as any other).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic_ai.capabilities import AbstractCapability, Instrumentation
from pydantic_ai.capabilities.abstract import (
    CapabilityOrdering,
    WrapModelRequestHandler,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import (
    ApprovalRequired,
    CallDeferred,
    ModelAPIError,
    ModelHTTPError,
    ModelRetry,
    UserError,
)
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
    ToolDefinition,
)
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

import crashproof as cp
from crashproof.integrations._calls_from_loop import function_tool_call
from crashproof.integrations.pydantic_ai._approvals import approval_tool, to_the_gate
from crashproof.integrations.pydantic_ai._bridge import bound, ctx_call
from crashproof.integrations.pydantic_ai._codec import (
    Projection,
    decision_value,
    request_args,
    revive,
    to_json,
)
from crashproof.integrations.pydantic_ai._effects import FunctionEffect
from crashproof.integrations.pydantic_ai._mcp import journal_mcp
from crashproof.models import FunctionTool

__all__ = ["EFFECT", "MODEL_RETRY", "STEP", "CrashproofDurability", "effect"]

#: Tool metadata marking a function tool as an effect: ``@agent.tool_plain(metadata=EFFECT)``.
#: An unknown outcome freezes the run for review (see ``effect`` for the other meanings).
EFFECT: dict[str, str] = {"crashproof": "effect"}


def effect(on_unknown: cp.OnUnknown | str = cp.OnUnknown.REVIEW) -> dict[str, str]:
    """Tool metadata marking a function tool as an effect, with what an unknown outcome
    means for it (a crash between its effect and its receipt; it has no lookup):
    ``@agent.tool_plain(metadata=effect(cp.OnUnknown.AT_LEAST_ONCE))``."""
    return {"crashproof": "effect", "on_unknown": cp.OnUnknown(on_unknown).value}


#: Tool metadata marking a function tool as local work (a step) under ``functions="effect"``.
STEP: dict[str, str] = {"crashproof": "step"}

#: Model requests: one try. pydantic-ai lets a hook call the model once per request
#: (``wrap_model_request`` may call its handler only once), so a transient error
#: (``cp.Unavailable``) stops the run resumable at once and the next drive asks again;
#: retries within a drive belong inside the model (its HTTP client, ``FallbackModel``).
MODEL_RETRY = cp.RetryPolicy(attempts=1, retry_on=(cp.Unavailable,))

_TRANSIENT = frozenset({408, 409, 429})


def _transient(exc: Exception) -> Exception:
    """A transient model error as ``cp.Unavailable`` (retried, then the run stops
    resumable); anything else as it is (the decision fails, recorded)."""
    if isinstance(exc, ModelHTTPError):
        if exc.status_code in _TRANSIENT or exc.status_code >= 500:
            return cp.Unavailable(f"model request failed: HTTP {exc.status_code}: {exc}")
        return exc
    if isinstance(exc, ModelAPIError):  # a connection error, a timeout, a stream cut
        return cp.Unavailable(f"model request failed: {exc}")
    return exc


def _usage(response: ModelResponse) -> dict[str, int]:
    u = response.usage
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "cached_tokens": u.cache_read_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
    }


@dataclass(init=False)
class CrashproofDurability(AbstractCapability[AgentDepsT]):
    """Make a named agent durable inside a crashproof workflow::

    durability = CrashproofDurability(tools={"open_pr": forge})
    agent = Agent(model, name="fixer", capabilities=[durability])

    @ledger.workflow("fix", version="1")
    async def fix(ctx: cp.AsyncContext, issue: str) -> str:
        with durable(ctx):
            return (await agent.run(issue)).output
    """

    name: str | None
    tools: Mapping[str, cp.Tool | FunctionTool]
    options: cp.StepOptions
    functions: Literal["step", "effect"]
    approvals: Literal["crashproof", "pydantic_ai"]
    on_unknown: cp.OnUnknown
    _agent: str | None = field(default=None, repr=False)
    # Per run (for_run makes a copy): the step key of the latest decision, and the
    # index of each of its tool calls.
    _base: str | None = field(default=None, repr=False)
    _index: dict[str, int] = field(default_factory=dict, repr=False)
    _projection: Projection = field(default_factory=Projection, repr=False)

    def __init__(
        self,
        *,
        name: str | None = None,
        tools: Mapping[str, cp.Tool] | Sequence[FunctionTool] | None = None,
        options: cp.StepOptions | None = None,
        functions: Literal["step", "effect"] = "step",
        approvals: Literal["crashproof", "pydantic_ai"] = "crashproof",
        on_unknown: cp.OnUnknown | str = cp.OnUnknown.REVIEW,
    ) -> None:
        """``name``: the agent's name if it has none; ``tools``: pydantic-ai tool name ->
        the ``cp.Tool`` that performs it as an act (the tool's function only declares
        its parameters), or a list of ``cp.models.tool`` functions: the agent's tools
        (added to it, their schemas from their signatures), each run as it declares
        (a step, its ``act=`` tools, an ``effect=``), a wrong call or a tool's error a
        message to the model; ``options``: for each model request (default: ``MODEL_RETRY``,
        one try);
        ``functions``: what an unmarked function tool is: a ``"step"`` (run again if a
        crash lands between its effect and its record) or an ``"effect"`` (an act
        without lookup: such a crash freezes the run for review instead); ``EFFECT``
        and ``STEP`` metadata choose per tool; ``approvals``: a tool call pydantic-ai
        defers for approval waits for crashproof's signed approval (``"crashproof"``)
        or ends the agent run with ``DeferredToolRequests`` (``"pydantic_ai"``);
        ``on_unknown``: what an unknown outcome means for a function tool marked as an
        effect whose metadata does not say (``effect(...)`` says it per tool)."""
        if functions not in ("step", "effect"):
            raise ValueError(f"CrashproofDurability: functions={functions!r}: 'step' or 'effect'")
        if approvals not in ("crashproof", "pydantic_ai"):
            raise ValueError(
                f"CrashproofDurability: approvals={approvals!r}: 'crashproof' or 'pydantic_ai'"
            )
        if name is not None and (not name or "#" in name):
            raise ValueError(f"CrashproofDurability: name {name!r} must be non-empty, no '#'")
        self.name = name
        self.tools = _tools(tools)
        self.options = options if options is not None else cp.StepOptions(retry=MODEL_RETRY)
        retry = self.options.retry
        if retry is not None and retry.attempts > 1:
            raise ValueError(
                "CrashproofDurability: a model request is tried once per drive (pydantic-ai "
                "lets a hook call the model only once); give options a RetryPolicy with "
                "attempts=1 and retry inside the model (its HTTP client, FallbackModel)"
            )
        self.functions = functions
        self.approvals = approvals
        self.on_unknown = cp.OnUnknown(on_unknown)
        self._agent = name
        self._base = None
        self._index = {}
        self._projection = Projection()

    # -- binding -------------------------------------------------------------------

    def for_agent(self, agent: Any) -> CrashproofDurability[AgentDepsT]:
        agent_name = self.name or getattr(agent, "name", None)
        if not agent_name:
            raise UserError(
                "CrashproofDurability needs a named agent: Agent(..., name='...') or "
                "CrashproofDurability(name='...'). The name is part of every journaled "
                "step, so it must not change between a crash and its resume"
            )
        if "#" in agent_name:
            raise UserError(f"CrashproofDurability: the agent's name {agent_name!r} holds '#'")
        agent_bound = copy.copy(self)
        agent_bound._agent = agent_name
        return agent_bound

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> CrashproofDurability[AgentDepsT]:
        run = copy.copy(self)
        run._base, run._index, run._projection = None, {}, Projection()
        return run

    def get_ordering(self) -> CapabilityOrdering:
        # Outside pydantic-ai's Instrumentation: a replayed model request or tool call
        # returns its record without entering it, so no span is emitted again for it.
        return CapabilityOrdering(position="outermost", wraps=(Instrumentation,))

    def _ctx(self) -> cp.Context | cp.AsyncContext:
        ctx = bound()
        if ctx is None:
            raise UserError(
                f"agent {self._agent!r} has CrashproofDurability but runs outside a "
                "crashproof workflow: call agent.run / run_sync inside `with durable(ctx):` "
                "in the workflow. Nothing was sent"
            )
        return ctx

    # -- hooks ---------------------------------------------------------------------

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        self._ctx()  # refuse before anything is sent
        # One call at a time, in the model's order: a per-run mode (a context var the run
        # body inherits), not each tool's definition replaced per request (prepare_tools).
        with ToolManager.parallel_execution_mode("sequential"):
            return await handler()

    def get_toolset(self) -> AbstractToolset[AgentDepsT] | None:
        functions = [t for t in self.tools.values() if isinstance(t, FunctionTool)]
        if not functions:
            return None
        return FunctionToolset([_as_pydantic_tool(f) for f in functions], id="crashproof")

    def get_wrapper_toolset(
        self, toolset: AbstractToolset[AgentDepsT]
    ) -> AbstractToolset[AgentDepsT] | None:
        return journal_mcp(str(self._agent), toolset)

    async def wrap_model_request(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        run_ctx = self._ctx()
        args = request_args(str(self._agent), request_context, self._projection)

        async def ask(**_: Any) -> cp.Decision:
            try:
                if request_context.streaming:
                    response = await _drained(ctx, request_context)
                else:
                    response = await handler(request_context)
            except Exception as exc:
                failure = _transient(exc)
                if failure is exc:
                    raise
                raise failure from exc
            return cp.Decision(
                decision_value(response), model=response.model_name, usage=_usage(response)
            )

        name = f"{self._agent}:model_request"
        value = await ctx_call(run_ctx, "decide", name, ask, options=self.options, **args)
        if request_context.streaming and isinstance(run_ctx, cp.AsyncContext):
            # Its events leave for the consumer: the decision is committed first (an
            # async drive commits at its next handoff); the sync shell committed it.
            await run_ctx.settle()
        key = run_ctx.last_key
        if not isinstance(key, str):
            raise cp.CrashproofError("the model request's decision left no step key")
        response = revive(value)
        self._projection.answered(len(request_context.messages), response, value)
        self._base = key.replace("#", ".")
        self._index = {
            part.tool_call_id: i
            for i, part in enumerate(p for p in response.parts if isinstance(p, ToolCallPart))
        }
        return response

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        if self.approvals == "pydantic_ai":
            return None
        self._ctx()
        return to_the_gate(requests)

    def _tool_step(self, call: ToolCallPart) -> str:
        index = self._index.get(call.tool_call_id)
        if self._base is None or index is None:
            # A call this run's model did not make (deferred results, a given history):
            # named by its id, which the history fixes.
            return f"{self._agent}:tool/{call.tool_call_id.replace('#', '.')}:{call.tool_name}"
        return f"{self._base}/{index}:{call.tool_name}"

    async def wrap_tool_execute(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        run_ctx = self._ctx()
        step = self._tool_step(call)
        tool = self.tools.get(call.tool_name)
        if isinstance(tool, FunctionTool):
            text, _ = await function_tool_call(run_ctx, tool, step, call.tool_call_id, args)
            return text
        metadata = tool_def.metadata or {}
        marked = metadata.get("crashproof", self.functions)
        if self.approvals == "crashproof" and ctx.tool_call_approved:
            tool = approval_tool(run_ctx, call.tool_name, handler, tool)
        elif tool is None and marked == "effect":
            tool = FunctionEffect.bind(run_ctx, call.tool_name, handler)
            tool.on_unknown = cp.OnUnknown(metadata.get("on_unknown", self.on_unknown))
        if tool is not None:
            try:
                result = await ctx_call(run_ctx, "act", step, tool, **to_json(args))
            except cp.ActNotDone as exc:  # settled as not done: the model is told so
                return f"not done: {exc}"
            return FunctionEffect.unwrap(result)

        async def run(call_id: str, params: dict[str, Any]) -> dict[str, Any]:
            try:
                output = await handler(params)
            except ModelRetry as exc:
                return {"tool_call_id": call_id, "retry": exc.message}
            except ApprovalRequired as exc:
                return {"tool_call_id": call_id, "deferred": "approval", "meta": exc.metadata}
            except CallDeferred as exc:
                return {"tool_call_id": call_id, "deferred": "call", "meta": exc.metadata}
            return {"tool_call_id": call_id, "output": to_json(output)}

        record = await ctx_call(
            run_ctx, "step", step, run, call_id=call.tool_call_id, params=to_json(args)
        )
        return _replayed(record)


def _tools(
    tools: Mapping[str, cp.Tool] | Sequence[FunctionTool] | None,
) -> dict[str, cp.Tool | FunctionTool]:
    """``tools=`` by tool name: a mapping as given (each a ``cp.Tool``), a list of
    ``cp.models.tool`` functions by their names."""
    if isinstance(tools, Mapping):
        for key, tool in tools.items():
            if not isinstance(tool, cp.Tool):
                raise TypeError(f"CrashproofDurability: tools[{key!r}] is not a cp.Tool")
        return dict(tools)
    out: dict[str, cp.Tool | FunctionTool] = {}
    for item in tools or ():
        if not isinstance(item, FunctionTool):
            raise TypeError(
                f"CrashproofDurability: a list of tools holds cp.models.tool functions, not "
                f"{item!r}; map a tool's name to a cp.Tool in a dict instead"
            )
        if item.name in out:
            raise ValueError(f"CrashproofDurability: two tools are named {item.name!r}")
        out[item.name] = item
    return out


def _as_pydantic_tool(function: FunctionTool) -> Tool[Any]:
    """``function`` as pydantic-ai's tool, with the schema ``cp.models.tool`` derived
    (pydantic's, as pydantic-ai derives its own). Its body is never called under the
    capability (``wrap_tool_execute`` runs the call); arguments are checked there."""

    def refuse(**arguments: Any) -> Any:
        raise UserError(
            f"tool {function.name!r} is a cp.models.tool function: it runs only inside "
            "`with durable(ctx):`, under CrashproofDurability"
        )

    return Tool.from_schema(
        refuse, function.name, function.description, function.schema, sequential=True
    )


async def _drained(ctx: RunContext[Any], request: ModelRequestContext) -> ModelResponse:
    """A streamed request's whole response, its stream drained inside the decision (as
    pydantic-ai's own durable engines drain it inside their unit). The handler is not
    called: given the live stream, pydantic-ai would run the response's tools while the
    decision is still open. The consumer gets the recorded response as pydantic-ai's
    replayed events (``CompletedStreamedResponse(replay_events=True)``), live and on
    replay alike."""
    async with request.model.request_stream(
        request.messages, request.model_settings, request.model_request_parameters, ctx
    ) as streamed:
        async for _ in streamed:
            pass
    return streamed.get()


def _replayed(record: Any) -> Any:
    """A function tool's recorded step back as pydantic-ai expects it: its output, or
    the control-flow exception the tool raised (a retry prompt, a deferral)."""
    if not isinstance(record, dict):
        raise cp.CrashproofError(f"a tool step recorded {record!r}, not a tool record")
    if "retry" in record:
        raise ModelRetry(str(record["retry"]))
    if record.get("deferred") == "approval":
        raise ApprovalRequired(metadata=record.get("meta"))
    if record.get("deferred") == "call":
        raise CallDeferred(metadata=record.get("meta"))
    return record.get("output")
