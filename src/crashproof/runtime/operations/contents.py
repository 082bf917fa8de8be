"""What a run's steps hold, read for a person (the console's run page, ``crashproof show
RUN --step KEY``): each step's recorded value, an act's params and receipt, a failure's
error with its traceback, a model call's reply as messages and tool calls with their
arguments, with the request that led to it (``runtime/operations/requests.py``), and a
``Workspace`` act as a diff.

Read-only, over a journal already verified by the caller (``Folds``). Nothing here
decides anything: a value is shown as it was recorded, a reply is recognised by its
shape (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages, as
``crashproof.models`` records the SDK's own JSON), and a Workspace diff is rebuilt from
what the intent journaled (the op's text, the prepared result, the earlier acts' results
on the same path). What is not recorded is said to be missing, never guessed: a request
not stored (``Ledger(store_requests=False)``), missing, or not matching its digest is refused
with the reason. What the run's policy marks secret is redacted
(``crashproof.runtime.operations.redaction``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType
from crashproof.runtime.operations.redaction import REDACTED, Redaction
from crashproof.runtime.operations.requests import (
    ModelRequest,
    conversation,
    model_requests,
    parsed_arguments,
)

__all__ = ["ModelReply", "ModelRequest", "Prompt", "StepContent", "step_contents"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """A model call's request as a conversation, or why it is not shown."""

    messages: tuple[dict[str, Any], ...] = ()  # role, text, tool_calls ({id, name, arguments})
    other: dict[str, Any] | None = None  # the request's other arguments: model, tools, ...
    refused: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelReply:
    """A model call's recorded reply as a conversation turn."""

    api: str  # "openai.chat", "openai.responses" or "anthropic.messages"
    model: str | None
    messages: tuple[dict[str, Any], ...]  # role, text, tool_calls: ({id, name, arguments})
    finish: str | None  # finish reason / stop reason / status
    response_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepContent:
    """Everything the journal holds about one step, for a person to read."""

    key: str
    kind: str
    status: str
    value: Any = None  # the result (an act: its receipt's result)
    has_value: bool = False
    # An act's params, as journaled with its intent ("[redacted]": a secret step's).
    params: dict[str, Any] | str | None = None
    tool: str | None = None
    receipt: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # type, message, args, traceback (when recorded)
    attempts: tuple[dict[str, Any], ...] = ()  # failed attempts that were retried
    reply: ModelReply | None = None
    diff: str | None = None  # a Workspace act's change (unified diff)
    model: str | None = None
    usage: dict[str, int] | None = None
    cost: float | None = None
    latency: float | None = None  # seconds, when the record holds its duration
    prompt: Prompt | None = None  # a decision's request


def step_contents(
    events: Sequence[Event],
    keys: Iterable[str],
    kept: Callable[[], Mapping[int, str]] = dict,
) -> dict[str, StepContent]:
    """The contents of the steps ``keys`` of the verified journal ``events``, in one
    pass (a Workspace diff reads the earlier acts on the same path, so the pass runs
    from the start). ``kept``: the run's request texts (``Store.load_requests``), read
    only if a wanted decision's request is kept beside its record."""
    wanted = set(keys)
    files: dict[str, str | None] = {}  # Workspace path -> content after the latest act
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        key = event.key
        if key is None:
            continue
        if event.type is EventType.ACT_INTENT:
            intent = payloads.act_intent(event)
            value = event.value if key in wanted or intent.get("tool") == "workspace" else None
            if isinstance(value, dict) and intent.get("tool") == "workspace":
                diff = _workspace_diff(value, files)
                if key in wanted:
                    found.setdefault(key, {})["diff"] = diff
            if key in wanted:
                entry = found.setdefault(key, {})
                entry["tool"] = intent.get("tool")
                if isinstance(value, dict):
                    entry["params"] = value.get("params")
        elif key in wanted and event.type is EventType.ATTEMPT_FAILED:
            failed = payloads.attempt_failed(event)
            entry = found.setdefault(key, {})
            entry.setdefault("attempts", []).append(
                {"attempt": failed.get("attempt"), "error": failed.get("error")}
            )
        elif key in wanted and event.type is EventType.STEP_DONE:
            found.setdefault(key, {})["done"] = event
    redaction = Redaction.of(events)
    requests = model_requests(events, [k for k, e in found.items() if "done" in e], kept)
    return {
        key: _content(key, entry, redaction, requests.get(key))
        for key, entry in found.items()
        if "done" in entry
    }


def _prompt(request: ModelRequest | None, redaction: Redaction, key: str) -> Prompt | None:
    if request is None:
        return None
    if request.refused is not None:
        return Prompt(refused=request.refused)
    if redaction.secret_step(key):
        return Prompt(refused="the step is secret under the run's policy: its request is redacted")
    messages, other = conversation(request)
    return Prompt(messages=tuple(redaction.value(messages)), other=redaction.value(other) or None)


def _content(
    key: str, entry: dict[str, Any], redaction: Redaction, request: ModelRequest | None
) -> StepContent:
    event: Event = entry["done"]
    done = payloads.step_done(event)
    kind = str(done.get("kind"))
    has_value = event.value_json is not None
    raw = event.value if has_value else None
    secret = redaction.secret_step(key)
    reply = model_reply(raw) if kind == "decide" and not secret else None
    if reply is not None:  # arguments are parsed from the model's text, then redacted
        reply = dataclasses.replace(reply, messages=redaction.value(reply.messages))
    took = done.get("took_us")
    latency = took / 1e6 if isinstance(took, int) else None
    if latency is None and isinstance(done.get("started_at"), float | int):
        latency = float(done.get("ended_at") or event.created_at) - float(done["started_at"])
    return StepContent(
        key=key,
        kind=kind,
        status=str(done.get("status")),
        value=redaction.value(raw, key) if has_value else None,
        has_value=has_value,
        params=None if entry.get("params") is None else redaction.value(entry["params"], key),
        tool=entry.get("tool"),
        receipt=redaction.held(done.get("receipt"), key),
        error=redaction.value(done.get("error")),
        attempts=tuple(redaction.value(entry.get("attempts", []))),
        reply=reply,
        diff=REDACTED if secret and entry.get("diff") else entry.get("diff"),
        model=done.get("model"),
        usage=done.get("usage"),
        cost=done.get("cost"),
        latency=latency,
        prompt=_prompt(request, redaction, key) if kind == "decide" else None,
    )


def model_reply(value: Any) -> ModelReply | None:
    """``value`` read as a model's reply, when it has the shape of one of the SDKs'
    responses; None otherwise (a decision of the user's own)."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("choices"), list):
        return _chat(value)
    if isinstance(value.get("output"), list):
        return _responses(value)
    if value.get("type") == "message" and isinstance(value.get("content"), list):
        return _anthropic(value)
    return None


def _chat(value: dict[str, Any]) -> ModelReply:
    messages, finish = [], None
    for choice in value["choices"]:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") or {}
        finish = choice.get("finish_reason", finish)
        calls = [
            {
                "id": call.get("id"),
                "name": (call.get("function") or {}).get("name"),
                "arguments": parsed_arguments((call.get("function") or {}).get("arguments")),
            }
            for call in message.get("tool_calls") or ()
            if isinstance(call, dict)
        ]
        messages.append(
            {
                "role": message.get("role", "assistant"),
                "text": message.get("content"),
                "tool_calls": calls,
            }
        )
    return ModelReply(
        api="openai.chat",
        model=value.get("model"),
        messages=tuple(messages),
        finish=finish,
        response_id=value.get("id"),
    )


def _responses(value: dict[str, Any]) -> ModelReply:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in value["output"]:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            texts.extend(
                str(part.get("text", ""))
                for part in item.get("content") or ()
                if isinstance(part, dict) and "text" in part
            )
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "name": item.get("name"),
                    "arguments": parsed_arguments(item.get("arguments")),
                }
            )
    message = {"role": "assistant", "text": "\n".join(texts) or None, "tool_calls": calls}
    return ModelReply(
        api="openai.responses",
        model=value.get("model"),
        messages=(message,),
        finish=value.get("status"),
        response_id=value.get("id"),
    )


def _anthropic(value: dict[str, Any]) -> ModelReply:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in value["content"]:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            calls.append(
                {"id": block.get("id"), "name": block.get("name"), "arguments": block.get("input")}
            )
    message = {
        "role": value.get("role", "assistant"),
        "text": "\n".join(texts) or None,
        "tool_calls": calls,
    }
    return ModelReply(
        api="anthropic.messages",
        model=value.get("model"),
        messages=(message,),
        finish=value.get("stop_reason"),
        response_id=value.get("id"),
    )


def _workspace_diff(value: dict[str, Any], files: dict[str, str | None]) -> str | None:
    """The change a Workspace act makes, from its journaled params and prepared state.
    The content before it is the previous act's result on the same path when its digest
    is the one this act saw; else only the op's own text is known."""
    params, prepared = value.get("params"), value.get("prepared")
    if not isinstance(params, dict) or not isinstance(prepared, dict):
        return None
    path = str(prepared.get("path") or params.get("path"))
    op = params.get("op")
    after = prepared.get("content")
    before = files.get(path) if path in files else None
    known = path in files or prepared.get("base") == "absent"
    if op == "append" and isinstance(after, str) and isinstance(params.get("text"), str):
        text = params["text"]
        if after.endswith(text):
            before, known = after[: len(after) - len(text)], True
    files[path] = after if isinstance(after, str) else None
    if op == "patch" and isinstance(params.get("diff"), str) and not known:
        return str(params["diff"])
    if not known:
        header = f"--- a/{path} (sha256 {prepared.get('base')}; its content was not recorded)\n"
        return header + "".join(f"+{line}" for line in str(after or "").splitlines(True))
    lines = difflib.unified_diff(
        (before or "").splitlines(True),
        (after or "").splitlines(True),
        fromfile="/dev/null" if before is None else f"a/{path}",
        tofile="/dev/null" if after is None else f"b/{path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
