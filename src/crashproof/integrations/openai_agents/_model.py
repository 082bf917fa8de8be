"""``CrashproofModel``: an Agents SDK ``Model`` whose ``get_response`` is one decision.

The decision's arguments are what the model receives: the model's name, the system
instructions, the input items as JSON, the settings, the tools' and handoffs' names and
schemas, the output schema and the ids of a server-side conversation. The value is the
response's output items, usage and id as JSON, revived as the SDK's own
``ModelResponse`` on the first run and on replay alike. ``stream_response`` is refused
before anything is sent: the streamed events could not be given again on replay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents.items import ModelResponse, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.usage import Usage
from pydantic import TypeAdapter

import crashproof as cp
from crashproof.integrations.openai_agents._bridge import bound, ctx_call

__all__ = ["CrashproofModel", "CrashproofModelProvider", "to_json"]

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
        args = {
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

        async def ask(**_: Any) -> cp.Decision:
            try:
                reply = await self.inner.get_response(
                    system_instructions, input, model_settings, tools, output_schema,
                    handoffs, tracing, previous_response_id=previous_response_id,
                    conversation_id=conversation_id, prompt=prompt, **extra,
                )  # fmt: skip
            except Exception as exc:
                failure = _transient(exc)
                if failure is exc:
                    raise
                raise failure from exc
            u = reply.usage
            return cp.Decision(
                {
                    "output": [to_json(item) for item in reply.output],
                    "usage": to_json(u),
                    "response_id": reply.response_id,
                },
                model=self.model_name,
                usage={
                    "input_tokens": u.input_tokens,
                    "output_tokens": u.output_tokens,
                    "total_tokens": u.total_tokens,
                },
            )

        value = await ctx_call(session, "decide", self.name, ask, options=self.options, **args)
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

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise cp.CrashproofError(
            f"model {self.model_name!r}: a streamed run (Runner.run_streamed) is not durable "
            "under crashproof, so it is refused before anything is sent; use Runner.run"
        )


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
