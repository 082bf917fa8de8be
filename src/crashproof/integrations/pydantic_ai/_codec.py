"""pydantic-ai's messages as crashproof records (sans I/O).

A model request is journaled as a decision whose arguments are a *projection* of what
is sent: the agent's name, the model's identity, the messages as JSON, the settings and
the function tools' names and schemas. pydantic-ai stamps every message with the time
it was made and the run's random id; those differ on every drive of the same workflow,
so they are left out of the projection (a replay would otherwise never match; the
SIGKILL matrix found ``model_id``). Every
other byte the model receives is bound by the digest: a prompt, a tool's schema or a
model changed under a live run freezes it (``cp.NonDeterminismError``).

The recorded value is the ``ModelResponse`` dumped by pydantic (its own adapter: the
JSON of pydantic-ai's ``ModelMessagesTypeAdapter``), and revived by
``ModelMessagesTypeAdapter`` on the first run and on replay alike, so both see the same
object.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import date, datetime, time, timedelta
from operator import getitem, is_
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
# A response dumped by its own adapter: the same JSON as ModelMessagesTypeAdapter's item
# (its tagged union serializes a response with this very schema), without the list and
# the union's dispatch (~10 µs a response against ~16).
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
_MAX_SAFE = 2**53 - 1  # RFC 8785: integers exact as IEEE doubles


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


_ATOMS = frozenset({str, int, float, bool, type(None), bytes, datetime, date, time, timedelta})


def _strip(value: Any) -> Any:
    """The dump without the keys pydantic-ai fills from the clock or an id, at any depth;
    a whole float as an int (RFC 8785 writes ``0.0`` as ``0``: the same bytes, and the
    canonical form need not rebuild the message to write it so)."""
    t = type(value)
    if t is dict:
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if t is list:
        return [_strip(v) for v in value]
    if t is float and value.is_integer() and -_MAX_SAFE <= value <= _MAX_SAFE:
        return int(value)
    return value


class _Watched:
    """What proves the messages sent so far unchanged: every mutable object in them (a
    dataclass's ``__dict__``, a list, a dict; any other object whole) beside a shallow
    copy of it, and every edge from a container to a mutable object in it.

    The proof is three C-level comparisons over flat lists, no Python call per message:
    the live containers equal their copies (a child that is the same object compares by
    identity at once; a changed or added field, element or key does not), each edge
    still leads to the same object (a child replaced by an equal one is caught here,
    since the copies would no longer watch it), and each dataclass still has the same
    ``__dict__``. ~0.1 µs an object, against ~3 µs a message for dataclass ``==``.
    Numbers compare as ``==`` does (``1 == True``), as dataclass ``==`` did."""

    __slots__ = ("copies", "dicts", "ends", "keys", "kids", "loose", "objects", "parents", "views")

    def __init__(self) -> None:
        self.views: list[Any] = []
        self.copies: list[Any] = []
        self.parents: list[Any] = []
        self.keys: list[Any] = []
        self.kids: list[Any] = []
        self.objects: list[Any] = []
        self.dicts: list[dict[str, Any]] = []
        self.ends: list[tuple[int, int, int]] = []  # per message: where its entries end
        # The containers whose keys are their dump's keys (dicts, pydantic-ai's own
        # dataclasses): a change under a key the projection leaves out is no change.
        self.loose: set[int] = set()

    def add(self, message: Any) -> None:
        if type(message) not in _ATOMS:
            self._walk(message)
        self.ends.append((len(self.views), len(self.kids), len(self.objects)))

    def _walk(self, value: Any) -> None:
        t = type(value)
        if t is tuple:  # cannot change: only what it holds can
            for v in value:
                if type(v) not in _ATOMS:
                    self._walk(v)
            return
        views = self.views
        if t is list:
            views.append(value)
            self.copies.append(list(value))
            items: Any = enumerate(value)
            loose = False
        elif t is dict or (dataclasses.is_dataclass(value) and hasattr(value, "__dict__")):
            loose = t is dict or t.__module__.startswith("pydantic_ai.")
            if t is not dict:
                self.objects.append(value)
                value = value.__dict__
                self.dicts.append(value)
            if loose:
                self.loose.add(len(views))
            views.append(value)
            self.copies.append(dict(value))
            items = value.items()
        else:  # any other object: compared whole, by its own ==
            views.append(value)
            self.copies.append(copy.deepcopy(value))
            return
        for k, v in items:
            if type(v) in _ATOMS or (loose and k in VOLATILE):
                continue  # nothing to watch inside (or left out of the projection)
            self.parents.append(value)
            self.keys.append(k)
            self.kids.append(v)
            self._walk(v)

    def same(self, upto: int) -> bool:
        """The first ``upto`` messages are as they were added (C-level: see the class)."""
        if not upto:
            return True
        v, e, o = self.ends[upto - 1]
        return (
            self.views[:v] == self.copies[:v]
            and all(map(is_, map(getitem, self.parents[:e], self.keys[:e]), self.kids[:e]))
            and all(map(is_, map(vars, self.objects[:o]), self.dicts[:o]))
        )

    def settle(self, index: int) -> bool:
        """Message ``index`` is as it was added but for keys the projection leaves out (a
        stamp pydantic-ai made after it was added): those are taken into its copies."""
        v0, e0, o0 = self.ends[index - 1] if index else (0, 0, 0)
        v1, e1, o1 = self.ends[index]
        views, copies = self.views, self.copies
        for i in range(v0, v1):
            now, was = views[i], copies[i]
            if now == was:
                continue
            if i not in self.loose or now.keys() != was.keys():
                return False
            changed = [k for k in now if now[k] is not was[k] and now[k] != was[k]]
            if not VOLATILE.issuperset(changed):
                return False
            for k in changed:
                was[k] = now[k]
        return all(
            map(is_, map(getitem, self.parents[e0:e1], self.keys[e0:e1]), self.kids[e0:e1])
        ) and all(map(is_, map(vars, self.objects[o0:o1]), self.dicts[o0:o1]))

    def truncate(self, upto: int) -> None:
        v, e, o = self.ends[upto - 1] if upto else (0, 0, 0)
        del self.views[v:], self.copies[v:], self.parents[e:], self.keys[e:], self.kids[e:]
        del self.objects[o:], self.dicts[o:], self.ends[upto:]
        self.loose = {i for i in self.loose if i < v}


class Projection:
    """The messages of one agent run as a ``cp.Transcript``: each message dumped and
    digested once while it is unchanged.

    An agent sends its whole history with every request. Dumping all of it each time
    was most of the projection's cost (~25 µs a message, per request), and a plain list
    made the arguments digest compare every earlier message again. Here each message is
    dumped once and appended to a Transcript, whose digest is the same as a plain
    list's with the same JSON and costs the new messages only. A later request reuses
    the prefix of messages that are the same objects and still as they were when added
    (``_Watched``: three C-level comparisons over the whole prefix, ~0.1 µs an object,
    no Python call per message); from the first one changed since (by pydantic-ai, or
    in place by anyone) the Transcript is built again, so the digest binds every
    message as it is sent. A change under a key the projection leaves out (a stamp
    pydantic-ai makes after the request hook returned) is taken in, not rebuilt.
    """

    __slots__ = ("_answered", "_sent", "_transcript", "_watched")

    def __init__(self) -> None:
        self._sent: list[ModelMessage] = []
        self._watched = _Watched()
        self._transcript = cp.Transcript()
        self._answered: int | None = None  # the answer added last, not yet sent back

    def messages(self, messages: list[ModelMessage]) -> cp.Transcript:
        sent, watched = self._sent, self._watched
        same = min(len(sent), len(messages))
        if not all(map(is_, messages[:same], sent[:same])):
            same = next(i for i in range(same) if messages[i] is not sent[i])
        answered, self._answered = self._answered, None
        if answered is not None and answered < same and not watched.settle(answered):
            same = answered  # pydantic-ai stamps an answer after the hook: taken in first
        if not watched.same(same):  # changed in place: from the first one changed
            same = next((i for i in range(same) if not watched.settle(i)), same)
        if same < len(sent):  # a message changed or left: its chain from there again
            self._transcript = cp.Transcript(self._transcript[:same])
            del sent[same:]
            watched.truncate(same)
        new = messages[same:]
        if new:
            transcript = self._transcript
            dumps = ModelMessagesTypeAdapter.dump_python(new, mode="json")
            for message, dumped in zip(new, dumps, strict=True):
                transcript.append(_strip(dumped))
                sent.append(message)
                watched.add(message)
        return self._transcript

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
        self._sent.append(response)
        self._watched.add(response)
        self._answered = sent


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
    return _RESPONSE.dump_python(response, mode="json")


def revive(value: Any) -> ModelResponse:
    """The recorded JSON back as pydantic-ai's ``ModelResponse``."""
    (message,) = ModelMessagesTypeAdapter.validate_python([value])
    if not isinstance(message, ModelResponse):
        raise TypeError(f"the recorded decision is a {type(message).__name__}, not a response")
    return message
