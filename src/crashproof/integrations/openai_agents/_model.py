"""``CrashproofModel``: an Agents SDK ``Model`` whose ``get_response`` is one decision.

The decision's arguments are what the model receives: the model's name, the system
instructions, the input items as JSON, the settings, the tools' and handoffs' names and
schemas, the output schema and the ids of a server-side conversation. The value is the
response's output items, usage and id as JSON, revived as the SDK's own
``ModelResponse`` on the first run and on replay alike. ``stream_response``
(``Runner.run_streamed``) is the same decision: the wrapped model's stream is drained
inside it, and the recorded response is emitted as events once recorded
(``replayed_events``), identically on the first run and on replay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents.items import ModelResponse, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from pydantic import TypeAdapter

import crashproof as cp
from crashproof.integrations.openai_agents._bridge import Session, bound, ctx_call

__all__ = ["CrashproofModel", "CrashproofModelProvider", "replayed_events", "to_json"]

_ANY: TypeAdapter[Any] = TypeAdapter(Any)
_OUTPUT: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])

#: Model calls: transient errors only (``cp.Unavailable``), 5 tries over about 15 s.
RETRY = cp.RetryPolicy(
    attempts=5, backoff=1.0, multiplier=2.0, max_backoff=60.0, jitter=0.2,
    retry_on=(cp.Unavailable,),
)  # fmt: skip


def to_json(value: Any) -> Any:
    return _ANY.dump_python(value, mode="json", exclude_none=True)


def _tool(t: Any) -> dict[str, Any]:
    return {
        "name": getattr(t, "name", type(t).__name__),
        "schema": getattr(t, "params_json_schema", None),
    }


def _transient(exc: Exception) -> Exception:
    import openai

    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        if code in (408, 409, 429) or code >= 500:
            return cp.Unavailable(f"model call failed: HTTP {code}: {exc}")
    if isinstance(exc, openai.APIConnectionError):  # a timeout too
        return cp.Unavailable(f"model call failed: {exc}")
    return exc


class CrashproofModel(Model):
    """``inner`` with each ``get_response`` journaled as ``ctx.decide(name, ...)``."""

    def __init__(
        self, inner: Model, *, name: str, model_name: str, options: cp.StepOptions
    ) -> None:
        self.inner = inner
        self.name = name
        self.model_name = model_name
        self.options = options

    def _args(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> dict[str, Any]:
        """What the model receives: the decision's arguments (streamed or not)."""
        return {
            "model": self.model_name,
            "instructions": system_instructions,
            "input": to_json(input),
            "settings": to_json(model_settings.to_json_dict()),
            "tools": [_tool(t) for t in tools],
            "handoffs": [{"name": h.tool_name, "schema": h.input_json_schema} for h in handoffs],
            "output_schema": None if output_schema is None else output_schema.json_schema(),
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": to_json(prompt),
        }

    def _decision(self, output: list[Any], usage: dict[str, Any], response_id: Any) -> cp.Decision:
        return cp.Decision(
            {"output": [to_json(item) for item in output], "usage": usage,
             "response_id": response_id},
            model=self.model_name,
            usage={k: int(usage.get(k) or 0)
                   for k in ("input_tokens", "output_tokens", "total_tokens")},
        )  # fmt: skip

    async def _decide(self, session: Session, args: dict[str, Any], ask: Any) -> ModelResponse:
        async def guarded(**_: Any) -> cp.Decision:
            try:
                decision: cp.Decision = await ask()
            except Exception as exc:
                failure = _transient(exc)
                if failure is exc:
                    raise
                raise failure from exc
            return decision

        value = await ctx_call(session, "decide", self.name, guarded, options=self.options, **args)
        key = session.ctx.last_key
        if not isinstance(key, str):
            raise cp.CrashproofError("the model call's decision left no step key")
        response = ModelResponse(
            output=_OUTPUT.validate_python(value["output"]),
            usage=Usage(
                **{k: v for k, v in value["usage"].items() if k != "request_usage_entries"}
            ),
            response_id=value.get("response_id"),
        )
        session.base = key.replace("#", ".")
        session.index = {
            str(getattr(item, "call_id", "")): i
            for i, item in enumerate(
                i for i in response.output if getattr(i, "type", "") == "function_call"
            )
        }
        return response

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
        **extra: Any,
    ) -> ModelResponse:
        session = bound(f"model {self.model_name!r}")
        args = self._args(
            system_instructions, input, model_settings, tools, output_schema, handoffs,
            previous_response_id, conversation_id, prompt,
        )  # fmt: skip

        async def ask() -> cp.Decision:
            reply = await self.inner.get_response(
                system_instructions, input, model_settings, tools, output_schema,
                handoffs, tracing, previous_response_id=previous_response_id,
                conversation_id=conversation_id, prompt=prompt, **extra,
            )  # fmt: skip
            return self._decision(reply.output, to_json(reply.usage), reply.response_id)

        return await self._decide(session, args, ask)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: Any = None,
        **extra: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """The same decision as ``get_response`` (a run may start streamed and resume
        not, or the reverse): the wrapped model's stream is drained inside it, and the
        recorded response is emitted as events (``replayed_events``) once it is
        recorded, the same on the first run and on replay."""
        session = bound(f"model {self.model_name!r}")
        args = self._args(
            system_instructions, input, model_settings, tools, output_schema, handoffs,
            previous_response_id, conversation_id, prompt,
        )  # fmt: skip

        async def ask() -> cp.Decision:
            completed: Any = None
            stream = self.inner.stream_response(
                system_instructions, input, model_settings, tools, output_schema,
                handoffs, tracing, previous_response_id=previous_response_id,
                conversation_id=conversation_id, prompt=prompt, **extra,
            )  # fmt: skip
            async for event in stream:
                if isinstance(event, ResponseCompletedEvent):
                    completed = event.response
            if completed is None:
                raise cp.Unavailable("the model's stream ended without response.completed")
            u = completed.usage
            usage = Usage(requests=1) if u is None else Usage(
                requests=1, input_tokens=u.input_tokens, output_tokens=u.output_tokens,
                total_tokens=u.total_tokens, input_tokens_details=u.input_tokens_details,
                output_tokens_details=u.output_tokens_details,
            )  # fmt: skip
            return self._decision(completed.output, to_json(usage), completed.id)

        response = await self._decide(session, args, ask)
        if isinstance(session.ctx, cp.AsyncContext):
            # The events leave for the consumer: the decision is committed first (an
            # async drive commits at its next handoff), so none is shown that a crash
            # could take back. The sync shell committed it already.
            await session.ctx.settle()
        for event in replayed_events(response, self.model_name):
            yield event


def replayed_events(response: ModelResponse, model: str) -> list[TResponseStreamEvent]:
    """What a streamed model call emits under crashproof, live and on replay: per
    output item, its text (an assistant message's whole ``output_text``, one
    ``response.output_text.delta``) and ``response.output_item.done``; then
    ``response.completed`` with the whole response."""
    events: list[Any] = []
    for i, item in enumerate(response.output):
        if getattr(item, "type", None) == "message":
            for j, part in enumerate(getattr(item, "content", None) or []):
                if getattr(part, "type", None) == "output_text":
                    events.append(ResponseTextDeltaEvent.model_construct(
                        type="response.output_text.delta", item_id=getattr(item, "id", ""),
                        output_index=i, content_index=j, delta=part.text, logprobs=[],
                        sequence_number=len(events),
                    ))  # fmt: skip
        events.append(ResponseOutputItemDoneEvent.model_construct(
            type="response.output_item.done", item=item, output_index=i,
            sequence_number=len(events),
        ))  # fmt: skip
    u = response.usage
    usage = ResponseUsage.model_construct(
        input_tokens=u.input_tokens, output_tokens=u.output_tokens, total_tokens=u.total_tokens,
        input_tokens_details=u.input_tokens_details, output_tokens_details=u.output_tokens_details,
    )  # fmt: skip
    whole = Response.model_construct(
        id=response.response_id or "", object="response", created_at=0, model=model,
        output=list(response.output), usage=usage, parallel_tool_calls=True,
        tool_choice="auto", tools=[],
    )  # fmt: skip
    events.append(ResponseCompletedEvent.model_construct(
        type="response.completed", response=whole, sequence_number=len(events),
    ))  # fmt: skip
    return events


class CrashproofModelProvider(ModelProvider):
    """Every model ``inner`` provides, journaled (``RunConfig(model_provider=...)``)."""

    def __init__(
        self, inner: ModelProvider, *, name: str = "model", options: cp.StepOptions | None = None
    ) -> None:
        self.inner = inner
        self.name = name
        self.options = options if options is not None else cp.StepOptions(retry=RETRY)

    def get_model(self, model_name: str | None) -> Model:
        if not model_name:
            raise cp.CrashproofError(
                "CrashproofModelProvider needs a named model (Agent(model='...')): the name "
                "is bound into every recorded model call"
            )
        return CrashproofModel(
            self.inner.get_model(model_name), name=self.name, model_name=model_name,
            options=self.options,
        )  # fmt: skip
