"""Model SDK calls recorded as decisions: OpenAI Chat Completions and Responses,
Anthropic Messages; sync and async; streamed or not. Extras: ``crashproof[openai]``,
``crashproof[anthropic]`` (``import crashproof`` imports neither SDK).

::

    llm = cp.models.openai_chat(ctx, client, prices={"gpt-4.1": cp.models.Price(
        input=2.0, output=8.0, cached_input=0.5)})
    @cp.models.tool                                          # a read: a step
    def run_tests(path: str = ".") -> str: ...               # its docstring: the description
    @cp.models.tool(act=forge)                               # an effect with a lookup
    def open_pr(title: str, branch: str) -> dict[str, Any]:
        return {"body": {"title": title, "head": branch}}    # forge's params

    reply = llm.create(model="gpt-4.1", messages=messages, tools=[run_tests, open_pr])
    messages += llm.reply_messages(reply)                    # the assistant turn, as JSON
    messages += llm.run_tools(reply)                         # the request's tools

- ``create(**request)`` is one ``ctx.decide``: its arguments digest is the request's,
  the recorded value the response's JSON, handed back as the SDK's own type
  (``ChatCompletion``, ``Response``, ``Message``) on the first run and on replay. Model,
  tokens (``input_tokens``, ``output_tokens``, ``cached_tokens``, ``total_tokens``) and the
  cost from ``prices`` (per million tokens; none shipped) go into the run's budget.
- ``create(..., on_event=fn)`` streams: each event of the SDK's stream helper reaches
  ``fn`` as it arrives; the assembled response is recorded and returned. On replay the
  recorded response is returned whole and ``fn`` is not called. A crash mid-stream
  records nothing: the call is made again, once, on resume.
- The SDK's hidden retries are turned off (``max_retries=0``): a 408/409/429/5xx, a
  dropped connection or a timeout raises ``cp.Unavailable`` (with ``Retry-After``),
  retried under ``options`` (default ``RETRY``), every attempt journaled. A 400-class
  error (a bad request, a refused key) is the SDK's exception: the decision fails,
  recorded, and the workflow may catch it.
- ``cp.models.tool(fn, act=, effect=, errors=)`` (``_functions.py``): a typed function
  as a model tool, its JSON schema from its signature and docstring; ``create(tools=[...])``
  sends it as the API's tool declaration. A read runs as a step; ``act=`` a ``cp.Tool``
  (the function maps the model's arguments to the tool's params), ``effect=`` a
  ``cp.OnUnknown`` (the function is the effect, an act without lookup).
- ``run_tools(reply, tools=None)`` runs the latest response's tool calls (by default with
  the request's ``cp.models.tool`` functions; or a mapping name -> ``cp.Tool`` (an act),
  plain function (a step) or ``FunctionTool``), keyed ``<decision key>/<index>:<tool>``;
  an unknown tool, arguments that are not JSON or do not fit the tool's schema, and a
  tool's own error (an exception, ``cp.ActFailed``) come back to the model as a
  recorded error message; crashproof's own errors propagate. What an unknown outcome of
  an act means is the tool's ``on_unknown`` (``cp.OnUnknown``); one settled as not done
  comes back to the model as ``not done: ...``.
- ``ctx_calls(tool, step, call_id, arguments)``: one call of such a function made by a
  framework's agent, as the ctx calls to make (what the pydantic-ai, Agents SDK and
  LangGraph integrations run when they are given ``cp.models.tool`` functions).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, overload

import crashproof as cp
from crashproof.models._anthropic import MESSAGES
from crashproof.models._api import Api
from crashproof.models._functions import FunctionTool, tool
from crashproof.models._openai import CHAT, RESPONSES
from crashproof.models._pricing import Price
from crashproof.models._recorder import RETRY, AsyncModelCall, ModelCall
from crashproof.models._tools import ctx_calls

if TYPE_CHECKING:
    from anthropic import Anthropic, AsyncAnthropic
    from anthropic.types import Message
    from openai import AsyncOpenAI, OpenAI
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

__all__ = [
    "RETRY",
    "AsyncModelCall",
    "FunctionTool",
    "ModelCall",
    "Price",
    "anthropic_messages",
    "ctx_calls",
    "openai_chat",
    "openai_responses",
    "tool",
]


def _bind(
    api: Api,
    what: str,
    ctx: Any,
    client: Any,
    name: str,
    prices: Mapping[str, Price] | None,
    options: cp.StepOptions | None,
) -> Any:
    if isinstance(name, str) and "#" in name:
        raise ValueError(f"{what}: name {name!r} may not hold '#'")
    endpoint_create = getattr(api.endpoint(client), "create", None)
    if endpoint_create is None:
        raise TypeError(f"{what}: {client!r} is not a client of this SDK (no such endpoint)")
    # The SDKs wrap their methods (functools.wraps): the coroutine function is underneath.
    is_async = inspect.iscoroutinefunction(inspect.unwrap(endpoint_create))
    if isinstance(ctx, cp.AsyncContext):
        if not is_async:
            raise cp.AsyncMisuse(
                f"{what}: an async workflow (cp.AsyncContext) needs the SDK's async client "
                f"(AsyncOpenAI / AsyncAnthropic), not {type(client).__name__}"
            )
        return AsyncModelCall(api, ctx, client, name, prices, options)
    if isinstance(ctx, cp.Context):
        if is_async:
            raise cp.AsyncMisuse(
                f"{what}: a sync workflow (cp.Context) needs the SDK's sync client "
                f"(OpenAI / Anthropic), not {type(client).__name__}"
            )
        return ModelCall(api, ctx, client, name, prices, options)
    raise TypeError(f"{what}: ctx must be a cp.Context or cp.AsyncContext, not {ctx!r}")


@overload
def openai_chat(
    ctx: cp.Context,
    client: OpenAI,
    *,
    name: str = ...,
    prices: Mapping[str, Price] | None = ...,
    options: cp.StepOptions | None = ...,
) -> ModelCall[ChatCompletion]: ...
@overload
def openai_chat(
    ctx: cp.AsyncContext,
    client: AsyncOpenAI,
    *,
    name: str = ...,
    prices: Mapping[str, Price] | None = ...,
    options: cp.StepOptions | None = ...,
) -> AsyncModelCall[ChatCompletion]: ...
def openai_chat(
    ctx: Any,
    client: Any,
    *,
    name: str = "chat",
    prices: Mapping[str, Price] | None = None,
    options: cp.StepOptions | None = None,
) -> Any:
    """OpenAI Chat Completions (``client.chat.completions``) bound to ``ctx``; each
    ``create`` is a decision named ``name`` (``chat``, ``chat#2``, ...)."""
    return _bind(CHAT, "openai_chat", ctx, client, name, prices, options)


@overload
def openai_responses(
    ctx: cp.Context,
    client: OpenAI,
    *,
    name: str = ...,
    prices: Mapping[str, Price] | None = ...,
    options: cp.StepOptions | None = ...,
) -> ModelCall[Response]: ...
@overload
def openai_responses(
    ctx: cp.AsyncContext,
    client: AsyncOpenAI,
    *,
    name: str = ...,
    prices: Mapping[str, Price] | None = ...,
    options: cp.StepOptions | None = ...,
) -> AsyncModelCall[Response]: ...
def openai_responses(
    ctx: Any,
    client: Any,
    *,
    name: str = "response",
    prices: Mapping[str, Price] | None = None,
    options: cp.StepOptions | None = None,
) -> Any:
    """OpenAI Responses (``client.responses``) bound to ``ctx``."""
    return _bind(RESPONSES, "openai_responses", ctx, client, name, prices, options)


@overload
def anthropic_messages(
    ctx: cp.Context,
    client: Anthropic,
    *,
    name: str = ...,
    prices: Mapping[str, Price] | None = ...,
    options: cp.StepOptions | None = ...,
) -> ModelCall[Message]: ...
@overload
def anthropic_messages(
    ctx: cp.AsyncContext,
    client: AsyncAnthropic,
    *,
    name: str = ...,
    prices: Mapping[str, Price] | None = ...,
    options: cp.StepOptions | None = ...,
) -> AsyncModelCall[Message]: ...
def anthropic_messages(
    ctx: Any,
    client: Any,
    *,
    name: str = "message",
    prices: Mapping[str, Price] | None = None,
    options: cp.StepOptions | None = None,
) -> Any:
    """Anthropic Messages (``client.messages``) bound to ``ctx``."""
    return _bind(MESSAGES, "anthropic_messages", ctx, client, name, prices, options)
