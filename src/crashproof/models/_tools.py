"""A response's tool calls, checked and named before anything runs (sans I/O).

Each call gets a step name derived from the decision's step key and the call's index
(``turn#3`` -> ``turn.3/0:open_pr``): stable, because the decision that holds the calls
is recorded. What the model got wrong (an unknown tool, arguments that are not JSON or do
not fit the tool's schema or the function's signature, an ``act=`` mapping that raised)
becomes an error message for the model, recorded as a step of its own, never an exception
in the workflow.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import crashproof as cp
from crashproof.models._api import ToolCall
from crashproof.models._functions import FunctionEffect, FunctionTool, output_text

__all__ = [
    "Handler",
    "Planned",
    "act_outcome",
    "as_text",
    "ctx_calls",
    "function_step",
    "handlers",
    "plan",
    "tool_error",
]

Handler = FunctionTool | cp.Tool | Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Planned:
    call: ToolCall
    step: str  # the ctx step name
    handler: Handler | None
    params: dict[str, Any]
    error: str | None  # what the model is told instead of running anything
    # The acts to run, in order (step key, tool, params): a cp.Tool's, an effect's, or
    # the act= tools of a FunctionTool; empty for a step.
    acts: tuple[tuple[str, cp.Tool, dict[str, Any]], ...] = ()


def _check(call: ToolCall, handler: Handler, schema: Any) -> tuple[dict[str, Any], str | None]:
    arguments = call.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return (
                {},
                f"error: the arguments of {call.name!r} are not valid JSON ({exc}); "
                "send one JSON object",
            )
    if not isinstance(arguments, dict):
        return (
            {},
            f"error: the arguments of {call.name!r} must be a JSON object, not "
            f"{type(arguments).__name__}",
        )
    if isinstance(schema, dict) and not isinstance(handler, FunctionTool):
        import jsonschema

        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(arguments)
        )
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            return (
                {},
                f"error: the arguments of {call.name!r} do not fit its schema "
                f"({where}: {error.message})",
            )
    if isinstance(handler, FunctionTool):
        try:
            handler.arguments(arguments)
        except ValueError as exc:
            return {}, f"error: the arguments of {call.name!r} do not fit its schema ({exc})"
        return arguments, None
    if not isinstance(handler, cp.Tool):
        try:
            inspect.signature(handler).bind(**arguments)
        except TypeError as exc:
            return {}, f"error: the arguments of {call.name!r} do not fit it ({exc})"
    return arguments, None


def plan(
    calls: list[ToolCall], key: str, handlers: Mapping[str, Handler], schemas: dict[str, Any]
) -> list[Planned]:
    """Each call with its step name and handler, or the error the model gets back."""
    base = key.replace("#", ".")  # a step name may not hold '#'
    out = []
    for call in calls:
        handler = handlers.get(call.name)
        if handler is None:
            known = ", ".join(sorted(handlers)) or "none"
            message = f"error: there is no tool named {call.name!r} (the tools are: {known})"
            out.append(Planned(call, f"{base}/{call.index}", None, {}, message))
            continue
        step = f"{base}/{call.index}:{call.name}"
        params, error = _check(call, handler, schemas.get(call.name))
        acts: tuple[tuple[str, cp.Tool, dict[str, Any]], ...] = ()
        if error is None:
            acts, error = _acts(step, handler, params)
        out.append(Planned(call, step, handler, params, error, acts))
    return out


def _acts(
    step: str, handler: Handler, arguments: dict[str, Any]
) -> tuple[tuple[tuple[str, cp.Tool, dict[str, Any]], ...], str | None]:
    """The acts of a checked call, or the error its ``act=`` mapping gave."""
    if isinstance(handler, cp.Tool):
        return ((step, handler, arguments),), None
    if not isinstance(handler, FunctionTool) or handler.kind == "step":
        return (), None
    if handler.kind == "effect":
        return ((step, FunctionEffect.of(handler), arguments),), None
    try:
        params = handler.params_for(handler.arguments(arguments))
    except TypeError:  # the mapping's own bug (not a dict): the workflow's, not the model's
        raise
    except Exception as exc:  # the mapping refused these arguments: the model reads why
        if handler.errors == "raise" or isinstance(exc, cp.CrashproofError):
            raise
        return (), f"error: {type(exc).__name__}: {exc}"
    if len(params) == 1:
        return ((step, handler.acts[0], params[0]),), None
    return tuple(
        (f"{step}/{j}", t, p) for j, (t, p) in enumerate(zip(handler.acts, params, strict=True))
    ), None


def handlers(tools: Mapping[str, Handler] | Sequence[FunctionTool]) -> dict[str, Handler]:
    """``run_tools``' tools by the name the model calls: a mapping as given, a sequence
    of function tools by their names."""
    if isinstance(tools, Mapping):
        return dict(tools)
    out: dict[str, Handler] = {}
    for item in tools:
        if not isinstance(item, FunctionTool):
            raise TypeError(
                f"run_tools: a list holds cp.models.tool functions, not {item!r}; map a "
                "name to a cp.Tool or a plain function in a dict instead"
            )
        if item.name in out:
            raise ValueError(f"run_tools: two tools are named {item.name!r}")
        out[item.name] = item
    return out


as_text = output_text


def tool_error(call_id: str, message: str) -> dict[str, Any]:
    """The recorded step of a call the model got wrong."""
    return {"tool_call_id": call_id, "output": message, "is_error": True}


def function_step(handler: Callable[..., Any]) -> Callable[[str, dict[str, Any]], Any]:
    """A function (a ``FunctionTool`` or a plain one) as a step body whose arguments are
    the call's id (recorded with the result) and the model's arguments; async when the
    function is. Its own exceptions are recorded as an error message for the model
    (a plain function's always, a ``FunctionTool``'s unless ``errors="raise"``);
    crashproof's own propagate."""
    function = handler if isinstance(handler, FunctionTool) else None
    if function is None:
        function = FunctionTool(
            name=getattr(handler, "__name__", "tool"),
            description="",
            schema={},
            fn=handler,
            is_async=inspect.iscoroutinefunction(handler),
        )  # no model: its arguments were checked against its signature in plan
    if function.is_async:

        async def run_async(call_id: str, params: dict[str, Any]) -> dict[str, Any]:
            return {"tool_call_id": call_id, **(await function.run_async(params))}

        return run_async

    def run(call_id: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"tool_call_id": call_id, **function.run(params)}

    return run


def act_outcome(handler: Any, call_id: str, value: Any) -> Any:
    """An act's value as a tool result: its receipt's, or the model told what failed."""
    if isinstance(value, cp.ActNotDone):  # its on_unknown said so: tell the model
        return tool_error(call_id, f"not done: {value}")
    if isinstance(value, cp.ActFailed):
        refused = isinstance(value, cp.PolicyViolation)  # crashproof's own: the run's
        if refused or (isinstance(handler, FunctionTool) and handler.errors == "raise"):
            raise value
        return tool_error(call_id, f"error: {value}")
    if isinstance(handler, FunctionTool) and handler.kind == "effect":  # FunctionEffect's record
        return {"tool_call_id": call_id, **value}
    return value


# One ctx call of a framework's tool call: (method, step name, work, keyword arguments).
CtxCall = tuple[str, str, Any, dict[str, Any]]


def ctx_calls(
    tool: FunctionTool, step: str, call_id: str, arguments: Any
) -> Generator[CtxCall, Any, tuple[str, bool]]:
    """One call of a ``cp.models.tool`` function by a framework's agent (pydantic-ai, the
    Agents SDK, LangGraph: their integrations take such functions as the agent's
    tools), as the ctx calls to make, sans I/O: yields ``(method, name, work, kwargs)``
    (``"step"`` with a function, or ``"act"`` with a ``cp.Tool``, under the step name
    ``step``, or ``step/<j>`` for the j-th of several acts); the caller makes each
    (``getattr(ctx, method)(name, work, **kwargs)``, sync or awaited) and sends back its
    value, or the ``cp.ActFailed`` it raised. Returns the text the model reads and
    whether it reports an error: arguments that do not fit the schema, the function's
    own exception and an act's failure are recorded as such text (under
    ``errors="message"``), as ``run_tools`` records them; crashproof's own errors
    propagate."""
    call = ToolCall(index=0, id=call_id, name=tool.name, arguments=arguments)
    params, error = _check(call, tool, None)
    acts: tuple[tuple[str, cp.Tool, dict[str, Any]], ...] = ()
    if error is None:
        acts, error = _acts(step, tool, params)
    value: Any
    if error is not None:
        value = yield "step", step, tool_error, {"call_id": call_id, "message": error}
    elif acts:
        for key, target, act_params in acts:
            value = act_outcome(tool, call_id, (yield "act", key, target, act_params))
            if isinstance(value, dict) and value.get("is_error"):
                break  # a later act of the same call depends on this one
    else:
        run = function_step(tool)
        value = yield "step", step, run, {"call_id": call_id, "params": params}
    if isinstance(value, dict) and "tool_call_id" in value:  # a step's record
        return str(value["output"]), bool(value.get("is_error"))
    return as_text(value), False
