"""pydantic-ai's messages as crashproof records (sans I/O).

A model request is journaled as a decision whose arguments are a *projection* of what
is sent: the agent's name, the model's identity, the messages as JSON, the settings and
the function tools' names and schemas. pydantic-ai stamps every message with the time
it was made and the run's random id; those differ on every drive of the same workflow,
so they are left out of the projection (a replay would otherwise never match; the
SIGKILL matrix found ``model_id``). Every
other byte the model receives is bound by the digest: a prompt, a tool's schema or a
model changed under a live run freezes it (``cp.NonDeterminismError``).

The recorded value is the ``ModelResponse`` dumped by pydantic-ai's own
``ModelMessagesTypeAdapter``, and revived by it on the first run and on replay alike,
so both see the same object.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model, ModelRequestContext

import crashproof as cp

__all__ = [
    "VOLATILE",
    "Projection",
    "decision_value",
    "model_identity",
    "request_args",
    "revive",
    "to_json",
]

#: Keys pydantic-ai fills from the clock or a random id on every drive, and a response's
#: ``model_id``, which the agent graph stamps on a response after the model answered live
#: but not on one a hook gave back (the model is bound by ``model`` in the arguments).
VOLATILE = frozenset({"timestamp", "run_id", "conversation_id", "model_id"})

_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def to_json(value: Any) -> Any:
    """Any tool result or setting as plain JSON (pydantic's own encoding)."""
    return _ANY.dump_python(value, mode="json")


def model_identity(model: Model) -> str:
    """``system:model_name``: what the digest binds. A model that names neither cannot
    be told apart from another across processes, so it is refused."""
    system = getattr(model, "system", None)
    name = getattr(model, "model_name", None)
    if not isinstance(name, str) or not name or not isinstance(system, str):
        raise TypeError(
            f"{type(model).__name__} names no stable model (system={system!r}, "
            f"model_name={name!r}): a recorded decision could not be matched to it on "
            "resume; nothing was sent"
        )
    return f"{system}:{name}"


_ATOMS = frozenset({str, int, float, bool, type(None), bytes, datetime})


def _clone(value: Any) -> Any:
    """A copy of a message to compare it with later: dataclasses and containers copied,
    immutable values shared (cheaper than ``copy.deepcopy`` by ~4x); other objects deep
    copied."""
    t = type(value)
    if t in _ATOMS:
        return value
    if t is list:
        return [_clone(v) for v in value]
    if t is dict:
        return {k: _clone(v) for k, v in value.items()}
    if t is tuple:
        return tuple([_clone(v) for v in value])
    fields = getattr(value, "__dict__", None)
    if fields is not None and dataclasses.is_dataclass(value):
        copied = object.__new__(t)
        copied.__dict__.update({k: _clone(v) for k, v in fields.items()})
        return copied
    return copy.deepcopy(value)


def _unchanged(kept: Any, message: Any) -> bool:
    """``message`` still equals ``kept``, its copy, but for the fields the projection
    leaves out (pydantic-ai stamps a response's ``run_id`` after a hook returned it:
    the copy takes the stamp, so the next request's comparison is one ``==`` again)."""
    if kept == message:
        return True
    if type(kept) is not type(message):
        return False
    was, now = kept.__dict__, message.__dict__
    if was.keys() != now.keys() or any(k not in VOLATILE and was[k] != v for k, v in now.items()):
        return False
    for k in VOLATILE.intersection(now):
        was[k] = now[k]
    return True


class Projection:
    """The messages of one agent run as a ``cp.Transcript``: each message dumped and
    digested once while it is unchanged.

    An agent sends its whole history with every request. Dumping all of it each time
    was most of the projection's cost (~25 µs a message, per request), and a plain list
    made the arguments digest compare every earlier message again. Here each message is
    dumped once, kept beside a copy of itself, and appended to a Transcript, whose
    digest is the same as a plain list's with the same JSON and costs the new messages
    only. A later request reuses the prefix of messages that are the same objects and
    still equal their copies (dataclass ``==``, field by field: ~2 µs); from the first
    one changed since (by pydantic-ai, or in place by anyone) the Transcript is built
    again, so the digest binds every message as it is sent. (``==`` holds ``1 == True``:
    a tool argument changed in place from one to the other after it was sent would go
    unseen.)
    """

    __slots__ = ("_sent", "_transcript")

    def __init__(self) -> None:
        self._sent: list[tuple[ModelMessage, ModelMessage]] = []  # (message, its copy)
        self._transcript = cp.Transcript()

    def messages(self, messages: list[ModelMessage]) -> cp.Transcript:
        sent, transcript = self._sent, self._transcript
        same = 0
        for message, (was, kept) in zip(messages, sent, strict=False):
            if message is not was or not _unchanged(kept, message):
                break
            same += 1
        if same < len(sent):  # a message changed or left: its chain from there again
            transcript = cp.Transcript(transcript[:same])
            del sent[same:]
        new = messages[same:]
        if new:
            dumps = ModelMessagesTypeAdapter.dump_python(new, mode="json")
            for message, dumped in zip(new, dumps, strict=True):
                transcript.append(_strip(dumped))
                sent.append((message, _clone(message)))
        self._transcript = transcript
        return transcript

    def answered(self, sent: int, response: ModelResponse, value: Any) -> None:
        """``response``, revived from its recorded JSON ``value``, answered the request of
        the first ``sent`` messages: it is the next message pydantic-ai sends, so it is
        projected from ``value`` now instead of dumped again then (~40 % of a request's
        projection). The dump of a revived response is ``value`` again (pydantic-ai's
        adapter both ways; tests/integrations/pydantic_ai/test_projection.py); the next
        request reuses it only if it sends this very object, unchanged."""
        if len(self._sent) != sent:  # not the messages just projected: nothing to add to
            return
        self._transcript.append(_strip(value))
        self._sent.append((response, _clone(response)))


def request_args(
    agent: str, request_context: ModelRequestContext, projection: Projection
) -> dict[str, Any]:
    """The decision's arguments: everything the model receives, minus clock and ids
    (``projection``: the agent run's dumps of its messages)."""
    messages: list[ModelMessage] = list(request_context.messages)
    params = request_context.model_request_parameters
    tools = [
        {"name": t.name, "parameters": t.parameters_json_schema, "kind": t.kind}
        for t in (*params.function_tools, *params.output_tools)
    ]
    return {
        "agent": agent,
        "model": model_identity(request_context.model),
        "messages": projection.messages(messages),
        "settings": to_json(request_context.model_settings or {}),
        "tools": tools,
        "output_mode": params.output_mode,
        "allow_text_output": params.allow_text_output,
    }


def decision_value(response: ModelResponse) -> Any:
    """The response's JSON, as recorded."""
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def revive(value: Any) -> ModelResponse:
    """The recorded JSON back as pydantic-ai's ``ModelResponse``."""
    (message,) = ModelMessagesTypeAdapter.validate_python([value])
    if not isinstance(message, ModelResponse):
        raise TypeError(f"the recorded decision is a {type(message).__name__}, not a response")
    return message
