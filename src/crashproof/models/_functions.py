"""A typed Python function as a model tool (``cp.models.tool``): its JSON schema from its
signature and docstring, its effect class, and how its calls run.

The schema is built as pydantic-ai's and the OpenAI Agents SDK's function tools build
theirs: each parameter becomes a field of a pydantic model (``create_model``), typed by its
annotation (none: any JSON), required unless it has a default, described by the
docstring's ``Args:`` (Google) or ``:param name:`` (Sphinx) entry or an
``Annotated[T, Field(description=...)]``; the docstring's text before those entries is
the tool's description. Unlike the Agents SDK's strict mode, a parameter with a default
stays optional. Titles are left out, extra arguments refused
(``additionalProperties: false``). ``*args``, ``**kwargs``, positional-only parameters
and annotations pydantic cannot turn into a schema are refused when the tool is defined,
with an error naming the tool and the parameter.

The model's arguments are validated against the same pydantic model, in pydantic's lax
mode as pydantic-ai does (``"3"`` for an ``int`` becomes 3, ``"x"`` is refused; a
``list[str]`` arrives as a list, a ``datetime`` parsed): what does not fit goes back to
the model as a tool message, nothing runs.

Effect classes (the ``cp.OnUnknown`` declarations are those of ``crashproof.tools.port``):

- ``tool(fn)``: a read (local work): a step, its output recorded with the tool-call id; a
  crash before the record runs it again.
- ``tool(fn, act=some_tool)``: an effect with the lookup of a ``cp.Tool`` (``GitTool``,
  ``Workspace``, ``HttpTool``, ``cp.Outbox``, your own): ``fn`` maps the model's arguments
  to the tool's params (it must be pure: it runs again on replay) and the call is
  ``ctx.act(key, some_tool, **fn(**arguments))``. ``act=[tool_a, tool_b]``: one model
  tool made of several acts in order (push, then open the pull request): ``fn`` returns
  a list of params, one per tool; keys ``<key>/0``, ``<key>/1``; the model reads the last
  act's result, or the first failure.
- ``tool(fn, effect=cp.OnUnknown.X)``: an effect without lookup: ``fn`` is the effect,
  run as an act; a crash between its effect and its receipt is settled as declared
  (``review``: the run freezes for a person; ``at_least_once``: run again;
  ``at_most_once``: recorded as not done, and the model is told so).
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, overload

import crashproof as cp

__all__ = ["FunctionEffect", "FunctionTool", "output_text", "tool"]

Errors = Literal["message", "raise"]
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the OpenAI and Anthropic APIs accept


def output_text(result: Any) -> str:
    """A tool's result as the text the model reads: a string as is, anything else as
    JSON (pydantic models, dataclasses, dates included)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except TypeError:
        from pydantic_core import to_json

        return to_json(result).decode()


def _error_text(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}: {exc}"


@dataclass(frozen=True, eq=False)
class FunctionTool:
    """A function the model may call; build it with ``cp.models.tool``. Calling it calls
    the function. ``schema`` is the JSON schema of its arguments."""

    name: str
    description: str
    schema: dict[str, Any]
    fn: Callable[..., Any]
    acts: tuple[cp.Tool, ...] = ()
    effect: cp.OnUnknown | None = None
    errors: Errors = "message"
    is_async: bool = False
    _model: Any = field(default=None, repr=False)
    _names: tuple[str, ...] = field(default=(), repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def kind(self) -> Literal["step", "act", "effect"]:
        return "act" if self.acts else "effect" if self.effect is not None else "step"

    def arguments(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The model's JSON arguments as the function's (validated, converted); a
        ``ValueError`` saying what does not fit, for the model to read."""
        if self._model is None:  # a plain function (run_tools' mapping): passed as given
            return dict(raw)
        from pydantic import ValidationError

        try:
            model = self._model.model_validate(raw)
        except ValidationError as exc:
            problems = [
                f"{'/'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors(include_url=False)[:5]
            ]
            raise ValueError("; ".join(problems)) from None
        return {name: getattr(model, f"p{i}") for i, name in enumerate(self._names)}

    def params_for(self, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """The ``act=`` tools' params for these (validated) arguments, one per tool."""
        params = self.fn(**arguments)
        many = params if isinstance(params, list | tuple) and len(self.acts) > 1 else [params]
        if len(many) != len(self.acts) or not all(isinstance(p, dict) for p in many):
            shape = "a dict" if len(self.acts) == 1 else f"a list of {len(self.acts)} dicts"
            raise TypeError(
                f"model tool {self.name!r}: with act=, the function returns the tools' "
                f"params ({shape}), not {params!r:.80}"
            )
        return list(many)

    def _failed(self, exc: Exception) -> dict[str, Any]:
        if self.errors == "raise" or isinstance(exc, cp.CrashproofError):
            raise exc
        return {"output": _error_text(exc), "is_error": True}

    def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Run the function on the model's arguments: ``{"output": text}``, or with
        ``"is_error": True`` when it raised (unless ``errors="raise"``)."""
        try:
            return {"output": output_text(self.fn(**self.arguments(raw)))}
        except Exception as exc:
            return self._failed(exc)

    async def run_async(self, raw: dict[str, Any]) -> dict[str, Any]:
        """As ``run``, the function awaited when it is ``async def``."""
        try:
            result = self.fn(**self.arguments(raw))
            if inspect.isawaitable(result):
                result = await result
            return {"output": output_text(result)}
        except Exception as exc:
            return self._failed(exc)


class FunctionEffect(cp.Tool):
    """A ``FunctionTool`` declared ``effect=``: its function as an act without lookup
    (the sync shell; ``AsyncFunctionEffect`` awaits). The receipt's result is the
    output record of ``FunctionTool.run``."""

    name: ClassVar[str] = "models.function"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(self, function: FunctionTool) -> None:
        if function.effect is None:
            raise ValueError(f"model tool {function.name!r} declares no effect")
        self.function = function
        self.on_unknown = function.effect

    @staticmethod
    def of(function: FunctionTool) -> FunctionEffect:
        return AsyncFunctionEffect(function) if function.is_async else FunctionEffect(function)

    def execute(self, call: cp.Call) -> cp.Receipt:
        return cp.Receipt(call.operation_id, self.function.run(call.params), call.intent_digest)


class AsyncFunctionEffect(FunctionEffect):
    async def execute(self, call: cp.Call) -> cp.Receipt:  # type: ignore[override]
        result = await self.function.run_async(call.params)
        return cp.Receipt(call.operation_id, result, call.intent_digest)


# -- the schema --------------------------------------------------------------------

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Returns?|Raises|Yields|Examples?):\s*$")
_GOOGLE_ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX = re.compile(r"^:param\s+(?:[^:\s]+\s+)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (the text before any section) and each parameter's description
    (Google ``Args:`` entries, Sphinx ``:param name:`` lines)."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    indent = 0
    for line in doc.splitlines():
        stripped = line.strip()
        heading = _SECTION.match(stripped)
        sphinx = _SPHINX.match(stripped)
        if heading:
            section, current = heading.group(1), None
        elif sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
        elif section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters", "Params") and stripped:
            depth = len(line) - len(line.lstrip())
            entry = _GOOGLE_ENTRY.match(stripped)
            if entry and (current is None or depth <= indent):
                current, indent = entry.group(1).lstrip("*"), depth
                params[current] = entry.group(2).strip()
            elif current is not None:
                params[current] = f"{params[current]} {stripped}".strip()
        elif section == "sphinx" and current is not None and stripped:
            if stripped.startswith(":"):
                current = None
            else:
                params[current] = f"{params[current]} {stripped}".strip()
    return "\n".join(summary).strip(), params


def _refuse(name: str, why: str) -> TypeError:
    return TypeError(f"model tool {name!r}: its signature cannot become a JSON schema: {why}")


def _schema(name: str, fn: Callable[..., Any], described: dict[str, str]) -> tuple[Any, ...]:
    """The arguments' pydantic model, its JSON schema and the parameter names."""
    from pydantic import ConfigDict, Field, PydanticUserError, TypeAdapter, create_model

    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise _refuse(name, f"{type(exc).__name__}: {exc}") from None
    fields: dict[str, Any] = {}
    names: list[str] = []
    for i, p in enumerate(signature.parameters.values()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind is p.VAR_POSITIONAL else "**"
            raise _refuse(name, f"{star}{p.name}: the model names each argument; list them")
        if p.kind is p.POSITIONAL_ONLY:
            raise _refuse(name, f"{p.name} is positional-only; the model passes names")
        annotation = hints.get(p.name, Any)
        try:
            TypeAdapter(annotation).json_schema()
        except (PydanticUserError, TypeError, ValueError) as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            first = text.split(". ")[0]  # pydantic's own advice (model_config) does not apply
            raise _refuse(name, f"parameter {p.name!r} ({annotation!r}): {first}") from None
        default = ... if p.default is p.empty else p.default
        # Fields named p0, p1, ... with the parameter's name as alias: a parameter may be
        # called json or schema without shadowing pydantic's own attributes.
        if p.name in described:
            spec = Field(default, alias=p.name, description=described[p.name])
        else:  # no description=None: it would hide an Annotated Field's description
            spec = Field(default, alias=p.name)
        fields[f"p{i}"] = (annotation, spec)
        names.append(p.name)
    try:
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        schema = model.model_json_schema(by_alias=True)
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise _refuse(name, str(exc).splitlines()[0]) from None
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    schema.setdefault("properties", {})
    schema.setdefault("required", [])  # stated when empty too, as strict schemas need
    return model, schema, tuple(names)


def _build(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    act: cp.Tool | Sequence[cp.Tool] | None,
    effect: cp.OnUnknown | str | None,
    errors: Errors,
) -> FunctionTool:
    if not callable(fn):
        raise TypeError(f"cp.models.tool takes a function, not {fn!r}")
    tool_name = name or getattr(fn, "__name__", "")
    if not isinstance(tool_name, str) or not _NAME.match(tool_name):
        raise ValueError(
            f"model tool {tool_name!r}: a tool's name is 1-64 letters, digits, '_' or '-'; "
            "pass name="
        )
    if act is not None and effect is not None:
        raise ValueError(
            f"model tool {tool_name!r}: act= (a cp.Tool with its lookup does the effect) or "
            "effect= (the function is the effect, no lookup), not both"
        )
    if isinstance(act, cp.Tool):
        acts: tuple[Any, ...] = (act,)
    else:
        acts = tuple(act) if isinstance(act, list | tuple) else () if act is None else (act,)
    if (act is not None and not acts) or not all(isinstance(a, cp.Tool) for a in acts):
        raise TypeError(f"model tool {tool_name!r}: act= takes cp.Tool(s), not {act!r}")
    if errors not in ("message", "raise"):
        raise ValueError(f"model tool {tool_name!r}: errors={errors!r}: 'message' or 'raise'")
    try:
        declared = None if effect is None else cp.OnUnknown(effect)
    except ValueError:
        choices = ", ".join(m.value for m in cp.OnUnknown)
        raise ValueError(f"model tool {tool_name!r}: effect={effect!r}: one of {choices}") from None
    is_async = inspect.iscoroutinefunction(inspect.unwrap(fn))
    if act is not None and is_async:
        raise TypeError(
            f"model tool {tool_name!r}: with act=, the function maps the model's arguments "
            "to the tool's params; make it a plain def (the act itself may be async)"
        )
    summary, described = parse_docstring(inspect.getdoc(fn) or "")
    model, schema, names = _schema(tool_name, fn, described)
    return FunctionTool(
        name=tool_name,
        description=description if description is not None else summary,
        schema=schema,
        fn=fn,
        acts=acts,
        effect=declared,
        errors=errors,
        is_async=is_async,
        _model=model,
        _names=names,
    )


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = ...,
    description: str | None = ...,
    act: cp.Tool | Sequence[cp.Tool] | None = ...,
    effect: cp.OnUnknown | str | None = ...,
    errors: Errors = ...,
) -> FunctionTool: ...
@overload
def tool(
    fn: None = ...,
    /,
    *,
    name: str | None = ...,
    description: str | None = ...,
    act: cp.Tool | Sequence[cp.Tool] | None = ...,
    effect: cp.OnUnknown | str | None = ...,
    errors: Errors = ...,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    act: cp.Tool | Sequence[cp.Tool] | None = None,
    effect: cp.OnUnknown | str | None = None,
    errors: Errors = "message",
) -> Any:
    """A typed function as a model tool, as a decorator (``@cp.models.tool``,
    ``@cp.models.tool(act=git)``) or a call (``cp.models.tool(env.read_file)``).

    ``name`` (default: the function's) and ``description`` (default: the docstring before
    its ``Args:``) are what the model sees. The effect class: none (a read, run as a
    step), ``act=`` a ``cp.Tool`` or a list of them (``fn`` maps the model's arguments
    to their params: the request template of an ``HttpTool``) or
    ``effect=`` a ``cp.OnUnknown`` (``fn`` is the effect, an act without lookup).
    ``errors``: ``"message"`` (default) turns the tool's own exceptions (and a ``cp.Tool``'s
    ``cp.ActFailed``) into a tool message for the model; ``"raise"`` lets them reach the
    workflow. crashproof's own errors (``cp.RunFrozen``, ``cp.LedgerError``, ...) always
    propagate. A signature that cannot become a JSON schema raises ``TypeError`` here."""
    if fn is None:
        return lambda f: _build(f, name, description, act, effect, errors)
    return _build(fn, name, description, act, effect, errors)
