"""One model call = one decision: the shared core and its sync and async shells.

``ModelCall.create(**request)`` is ``ctx.decide(name, ask, **request)``: the request's
keyword arguments are the decision's arguments (their digest is what replay matches;
``messages=`` passes through as the plain list it is), ``ask`` calls the SDK with its
hidden retries off, and what is recorded is the response's JSON with the model, the
tokens and the cost (``cp.Decision``). The workflow gets the SDK's own type back, revived
from the recorded JSON on the first run and on replay alike, so both see the same object.

The shells differ only in how they call the SDK (``create`` / ``stream`` and iterating,
awaited or not); the request checks, the mapping of the response and the tool plan are
the core's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import crashproof as cp
from crashproof.models._api import Api, dump
from crashproof.models._failures import classify
from crashproof.models._functions import FunctionTool
from crashproof.models._pricing import Price, cost_of
from crashproof.models._tools import (
    Handler,
    Planned,
    act_outcome,
    as_text,
    function_step,
    handlers,
    plan,
    tool_error,
)

__all__ = ["RETRY", "AsyncModelCall", "ModelCall"]

R = TypeVar("R")
# run_tools' core: yields (ctx method, args, keyword args), receives each call's value.
_Calls = Generator[tuple[str, tuple[Any, ...], dict[str, Any]], Any, list[dict[str, Any]]]
Tools = Mapping[str, Handler] | Sequence[FunctionTool]

#: The default for model calls: transient errors only (``cp.Unavailable``), 5 tries over
#: about 15 s; the runtime waits at least the server's ``Retry-After``.
RETRY = cp.RetryPolicy(
    attempts=5,
    backoff=1.0,
    multiplier=2.0,
    max_backoff=60.0,
    jitter=0.2,
    retry_on=(cp.Unavailable,),
)


class _Core(Generic[R]):
    def __init__(
        self,
        api: Api,
        ctx: Any,
        client: Any,
        name: str,
        prices: Mapping[str, Price] | None,
        options: cp.StepOptions | None,
    ) -> None:
        self._api = api
        self._ctx = ctx
        # Every attempt goes through the decision's RetryPolicy, where it is journaled; the
        # SDK's own retries would hide them (and wait outside any budget).
        self._client = client.with_options(max_retries=0)
        self.name = name
        self.prices = prices
        self.options = options if options is not None else cp.StepOptions(retry=RETRY)
        # The latest response, its step key and the function tools of its request.
        self._last: tuple[Any, str, dict[str, Handler]] | None = None
        self._schemas: dict[str, Any] = {}
        self._functions: dict[str, Handler] = {}

    def _check(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request as sent: its ``cp.models.tool`` functions as the API's tool
        declarations (their schemas); refused when it cannot be recorded."""
        if "stream" in request:
            raise ValueError(
                f"{self._api.label}: pass on_event=callback to stream, not stream=; the "
                "recorder assembles and records the whole response"
            )
        for field in ("messages", "input"):
            items = request.get(field)
            if isinstance(items, list) and any(hasattr(m, "model_dump") for m in items):
                raise cp.SerializationError(
                    f"{self._api.label}: {field}= holds an SDK object, which is not JSON; "
                    "nothing was sent or recorded. Append llm.reply_messages(reply) (the "
                    "same turn as plain JSON) instead of the SDK's message"
                )
        tools = request.get("tools")
        functions = [t for t in tools or () if isinstance(t, FunctionTool)]
        if functions:
            specs = [
                self._api.tool_spec(t) if isinstance(t, FunctionTool) else t for t in tools or ()
            ]
            request = {**request, "tools": specs}
        self._functions = handlers(functions)
        self._schemas = self._api.schemas(request.get("tools"))
        return request

    def _failure(self, exc: Exception) -> Exception:
        return classify(exc, self._api.label)

    def _decision(self, reply: Any, request: dict[str, Any]) -> cp.Decision:
        model, usage = self._api.usage(reply)
        return cp.Decision(
            dump(reply),
            model=model,
            usage=usage.as_dict(),
            cost=cost_of(self.prices, model, usage),
            attributes=self._telemetry(reply, request, model, usage.input, usage.output),
        )

    def _telemetry(
        self, reply: Any, request: dict[str, Any], model: str | None, used: int, made: int
    ) -> dict[str, Any]:
        """The call under the OpenTelemetry GenAI semantic conventions (gen_ai.* as of
        semantic-conventions 1.37: ``gen_ai.provider.name``, which replaced
        ``gen_ai.system``); the requested model is the request's, the response's the
        server's. Live only: never journaled (``cp.Decision.attributes``)."""
        found: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self._api.provider,
            "gen_ai.request.model": request.get("model"),
            "gen_ai.response.model": model,
            "gen_ai.response.id": getattr(reply, "id", None),
            "gen_ai.response.finish_reasons": self._api.finish_reasons(reply) or None,
            "gen_ai.usage.input_tokens": used,
            "gen_ai.usage.output_tokens": made,
        }
        return {k: v for k, v in found.items() if v is not None}

    def _kept(self, data: Any) -> R:
        reply: R = self._api.revive(data)
        key = self._ctx.last_key
        if not isinstance(key, str):
            raise cp.CrashproofError(f"{self._api.label}: the decision left no step key")
        self._last = (reply, key, self._functions)
        return reply

    def reply_messages(self, reply: R) -> list[dict[str, Any]]:
        """``reply`` as the messages (input items) to append to the conversation: plain
        JSON, so the next request's digest stays cheap and exact."""
        return self._api.reply_messages(reply)

    def _plan(self, reply: R, tools: Tools | None) -> list[Planned]:
        if self._last is None or self._last[0] is not reply:
            raise cp.CrashproofError(
                f"{self._api.label}: run_tools takes the response this recorder returned "
                "last (its step key names the tool calls); call it right after create"
            )
        found = self._last[2] if tools is None else handlers(tools)
        return plan(self._api.tool_calls(reply), self._last[1], found, self._schemas)

    def _dispatch(self, reply: R, tools: Tools | None) -> _Calls:
        """The ctx calls of ``run_tools``, one at a time (the shell makes each, sync or
        awaited, and sends its value back, or the ``cp.ActFailed`` it raised); returns
        the tool-result messages."""
        done: list[tuple[Planned, Any]] = []
        for planned in self._plan(reply, tools):
            handler, call_id = planned.handler, planned.call.id
            if planned.error is not None:
                value = yield "step", (planned.step, tool_error, call_id, planned.error), {}
            elif planned.acts:
                for key, tool, params in planned.acts:
                    value = act_outcome(handler, call_id, (yield "act", (key, tool), params))
                    if isinstance(value, dict) and value.get("is_error"):
                        break  # a later act of the same call depends on this one
            elif handler is not None and not isinstance(handler, cp.Tool):
                runner = function_step(handler)
                value = yield "step", (planned.step, runner, call_id, planned.params), {}
            else:
                raise cp.CrashproofError("a planned tool call lost its handler")
            done.append((planned, value))
        return self._results(done)

    def _results(self, done: list[tuple[Planned, Any]]) -> list[dict[str, Any]]:
        out = []
        for planned, value in done:
            if isinstance(value, dict) and "tool_call_id" in value:  # a step's record
                out.append((planned.call, str(value["output"]), bool(value.get("is_error"))))
            else:  # an act's receipt result
                out.append((planned.call, as_text(value), False))
        return self._api.tool_results(out)


class ModelCall(_Core[R]):
    """A model endpoint bound to a sync ``cp.Context``: ``create`` is one decision."""

    def create(self, *, on_event: Callable[[Any], None] | None = None, **request: Any) -> R:
        """Ask the model once (the SDK's ``create`` arguments); recorded, never asked
        again. ``on_event``: stream instead, each event of the SDK's stream helper passed
        to it as it arrives; the assembled response is what is recorded and returned."""
        request = self._check(request)
        ask = functools.partial(self._ask, on_event)
        return self._kept(self._ctx.decide(self.name, ask, options=self.options, **request))

    def _ask(self, on_event: Callable[[Any], None] | None, **request: Any) -> cp.Decision:
        endpoint = self._api.endpoint(self._client)
        try:
            if on_event is None:
                reply = endpoint.create(**request)
            else:
                with endpoint.stream(**self._api.stream_request(request)) as events:
                    for event in events:
                        on_event(event)
                    reply = getattr(events, self._api.final)()
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
            raise failure from exc
        return self._decision(reply, request)

    def run_tools(self, reply: R, tools: Tools | None = None) -> list[dict[str, Any]]:
        """Run the tool calls of ``reply`` (the latest response); returns the tool-result
        messages to append. ``tools``: the ``cp.models.tool`` functions of the request
        (the default), a list of them, or a mapping from the tool's name to a
        ``FunctionTool``, a ``cp.Tool`` (an act, given the model's arguments as its
        params) or a plain function (a step). A call the model got wrong, and a tool's
        own error, come back as a recorded error message."""
        calls = self._dispatch(reply, tools)
        value: Any = None
        try:
            while True:
                method, args, params = calls.send(value)
                try:
                    value = getattr(self._ctx, method)(*args, **params)
                except cp.ActFailed as exc:  # recorded, raised again on replay: _dispatch
                    value = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


class AsyncModelCall(_Core[R]):
    """A model endpoint bound to a ``cp.AsyncContext``: ``await create(...)``."""

    async def create(self, *, on_event: Callable[[Any], Any] | None = None, **request: Any) -> R:
        """As ``ModelCall.create``, awaited; ``on_event`` may be ``async def``."""
        request = self._check(request)
        ask = functools.partial(self._ask, on_event)
        data = await self._ctx.decide(self.name, ask, options=self.options, **request)
        return self._kept(data)

    async def _ask(self, on_event: Callable[[Any], Any] | None, **request: Any) -> cp.Decision:
        endpoint = self._api.endpoint(self._client)
        try:
            if on_event is None:
                reply = await endpoint.create(**request)
            else:
                async with endpoint.stream(**self._api.stream_request(request)) as events:
                    async for event in events:
                        shown = on_event(event)
                        if shown is not None and hasattr(shown, "__await__"):
                            await shown
                    reply = await getattr(events, self._api.final)()
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
            raise failure from exc
        return self._decision(reply, request)

    async def run_tools(self, reply: R, tools: Tools | None = None) -> list[dict[str, Any]]:
        """As ``ModelCall.run_tools``, awaited; handlers may be ``async def``."""
        calls = self._dispatch(reply, tools)
        value: Any = None
        try:
            while True:
                method, args, params = calls.send(value)
                try:
                    value = await getattr(self._ctx, method)(*args, **params)
                except cp.ActFailed as exc:  # recorded, raised again on replay: _dispatch
                    value = exc
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
