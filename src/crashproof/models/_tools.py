"""A response's tool calls, checked and named before anything runs (sans I/O).

Each call gets a step name derived from the decision's step key and the call's index
(``turn#3`` -> ``turn.3/0:open_pr``): stable, because the decision that holds the calls
is recorded. What the model got wrong (an unknown tool, arguments that are not JSON or do
not fit the tool's schema or the function's signature) becomes an error message for the
model, recorded as a step of its own, never an exception in the workflow.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import crashproof as cp
from crashproof.models._api import ToolCall

__all__ = ["Planned", "as_text", "function_step", "plan", "tool_error"]

Handler = cp.Tool | Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Planned:
    call: ToolCall
    step: str  # the ctx step name
    handler: Handler | None
    params: dict[str, Any]
    error: str | None  # what the model is told instead of running anything


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
    if isinstance(schema, dict):
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
        params, error = _check(call, handler, schemas.get(call.name))
        out.append(Planned(call, f"{base}/{call.index}:{call.name}", handler, params, error))
    return out


def as_text(result: Any) -> str:
    """A tool's result as the text the model reads."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def tool_error(call_id: str, message: str) -> dict[str, Any]:
    """The recorded step of a call the model got wrong."""
    return {"tool_call_id": call_id, "output": message, "is_error": True}


def function_step(fn: Callable[..., Any]) -> Callable[[str, dict[str, Any]], Any]:
    """``fn`` as a step body whose arguments are the call's id (recorded with the
    result) and parameters; async when ``fn`` is."""
    if inspect.iscoroutinefunction(fn):

        async def run_async(call_id: str, params: dict[str, Any]) -> dict[str, Any]:
            return {"tool_call_id": call_id, "output": as_text(await fn(**params))}

        return run_async

    def run(call_id: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"tool_call_id": call_id, "output": as_text(fn(**params))}

    return run
