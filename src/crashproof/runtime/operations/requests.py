"""A model call's request, rebuilt from the journal for a person to read (the console's
run page, ``crashproof show RUN --step KEY``), and proven against its digests.

A live decision stores its request (``Ledger(store_requests=True)``, the default) beside
its ``step_done`` record, in the same transaction (``KeptRequest``; the store's
``requests`` table, ``Store.load_requests``), and the record holds the SHA-256 of the
text as its last field, ``request_sha256``, under its MAC. So a resume never reads or
verifies the request's bytes: the journal stays the size it is without them (#42). The
text (``runtime/steps/arguments.py`` builds it while digesting) is JSON:
``{"f": 1|2, "args": [part, ...], "kwargs": {name: part}}``, a part being ``{"v": value}``
or, for a list argument, ``{"base": n, "new": [element, ...]}``: the list is the first
``n`` elements of the same slot's (step name and position or keyword) previous stored
request, then ``new``. An agent loop's turn thus stores the messages it adds, not its
whole history. Journals written before schema 9 (PostgreSQL 6) hold the same text inline,
as the record's last field ``request``: still read and shown.

The texts are read only when a decision is to be shown, once per page, and each is
checked against its record's ``request_sha256`` before it is parsed. Folding them in
order gives each call's request back, and each is shown only when its digest is the
recorded arguments digest (format 2: the list chains extended with the new elements,
O(new) a call; format 1: from scratch). Anything else is a marked refusal, never a
guess: a request not stored (``Ledger(store_requests=False)``: prompts a team must not
keep), or a journal older than stored requests; a text missing or not the one its
record names (altered in the ledger); a base whose earlier part is missing; or one that
does not match the arguments digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crashproof.journal import payloads
from crashproof.journal.codec import args_digest, canonical_bytes
from crashproof.journal.records import Event, EventType, request_sha256
from crashproof.journal.transcript import LIST_SEED, chain, v2_of_parts

__all__ = ["NOT_STORED", "ModelRequest", "conversation", "model_requests", "parsed_arguments"]

NOT_STORED = "the request was not stored (bound by its digest only)"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """A decision's request as its function was called: verified, or why not shown."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    refused: str | None = None  # set: nothing else is shown


class _Refused(Exception):
    pass


class _Fold:
    """Each step name's list slots: the elements and chain states of its last request."""

    def __init__(self) -> None:
        self.slots: dict[str, dict[int | str, tuple[list[Any], list[bytes]]]] = {}

    def request(self, key: str, digest: Any, text: Any) -> ModelRequest:
        name = key.partition("#")[0]
        held = self.slots.pop(name, {})
        if isinstance(text, ModelRequest):  # refused before it was read (_text)
            return text
        if not isinstance(text, str):
            return ModelRequest(refused=NOT_STORED)  # the next stored one is whole
        try:
            stored = json.loads(text)
            form, args, kwargs = stored["f"], stored["args"], stored["kwargs"]
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise _Refused("malformed")
            slots: dict[int | str, tuple[list[Any], list[bytes]]] = {}
            values = [self._part(held, slots, i, p) for i, p in enumerate(args)]
            named = {k: self._part(held, slots, k, p) for k, p in kwargs.items()}
            args_of = tuple(v for v, _ in values)
            kwargs_of = {k: v for k, (v, _) in named.items()}
            if form == 2:
                got = v2_of_parts([p for _, p in values], {k: p for k, (_, p) in named.items()})
            else:
                got = args_digest(args_of, kwargs_of, what="request", key=key)
        except _Refused as refused:
            return ModelRequest(refused=f"the stored request is incomplete: {refused}")
        except (ValueError, KeyError, TypeError) as error:
            return ModelRequest(refused=f"the stored request does not read: {error}")
        if got != digest:
            return ModelRequest(
                refused="the stored request does not match the recorded arguments digest: "
                "it is not shown (the journal's request was altered or is incomplete)"
            )
        self.slots[name] = {**held, **slots}
        return ModelRequest(args=args_of, kwargs=kwargs_of)

    @staticmethod
    def _part(
        held: dict[int | str, tuple[list[Any], list[bytes]]],
        slots: dict[int | str, tuple[list[Any], list[bytes]]],
        slot: int | str,
        part: Any,
    ) -> tuple[Any, str]:
        """The argument and its digest part (``journal/transcript.py``)."""
        if not isinstance(part, dict):
            raise _Refused(f"argument {slot!r}")
        if "v" in part:
            value = part["v"]
            return value, "j:" + _element(value).hex()
        base, new = part["base"], part["new"]
        if type(base) is not int or base < 0 or not isinstance(new, list):
            raise _Refused(f"argument {slot!r}")
        items, states = held.get(slot, ([], [LIST_SEED]))
        if base > len(items):
            raise _Refused(f"the earlier messages of argument {slot!r} were not stored")
        items, states = items[:base], states[: base + 1]
        state = states[-1]
        for value in new:
            state = chain(state, _element(value))
            items.append(value)
            states.append(state)
        slots[slot] = (items, states)
        return list(items), "l:" + state.hex()


def _text(text: str | None, sha: Any) -> str | ModelRequest:
    """A request text kept beside its record, once it proved to be the one the record's
    digest names (before anything parses it); else the refusal."""
    if text is None:
        return ModelRequest(
            refused="the stored request is missing: its record names one, the ledger has none "
            "(removed, or the run was copied without it)"
        )
    if not isinstance(sha, str) or request_sha256(text) != sha:
        return ModelRequest(
            refused="the stored request does not match the digest its record holds: it is "
            "not shown (the ledger's request was altered)"
        )
    return text


def _element(value: Any) -> bytes:
    return hashlib.sha256(canonical_bytes(value, what="request")).digest()


def model_requests(
    events: Sequence[Event],
    keys: Iterable[str],
    kept: Callable[[], Mapping[int, str]] = dict,
) -> dict[str, ModelRequest]:
    """The requests of the decisions ``keys`` of the verified journal ``events``, folded
    from the first decision on (each stores what it adds to the one before). ``kept``:
    the run's request texts kept beside its records (``Store.load_requests``), read
    once, when a record names one, and only when a decision is wanted."""
    wanted, fold = set(keys), _Fold()
    found: dict[str, ModelRequest] = {}
    texts: Mapping[int, str] | None = None
    if not wanted:
        return found
    for event in events:
        key = event.key
        if key is None or event.type is not EventType.STEP_DONE:
            continue
        text = event.payload_json
        if text is not None and not text.startswith('{"kind":"decide"'):
            continue  # not a decision (the runtime writes kind first): not decoded
        done = payloads.step_done(event)
        if done.get("kind") != "decide":
            continue
        stored: Any = done.get("request")  # inline: a journal before schema 9 (6 on PostgreSQL)
        sha = done.get("request_sha256")
        if sha is not None:
            if texts is None:
                texts = kept()
            stored = _text(texts.get(event.seq), sha)
        request = fold.request(key, done.get("digest"), stored)
        if key in wanted:
            found[key] = request
    return found


def conversation(request: ModelRequest) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The request read as a conversation (OpenAI Chat and Responses, Anthropic Messages,
    as ``crashproof.models`` passes them): each message's role, text and tool calls
    ``({id, name, arguments})``, and the request's other arguments (model, tools, ...)."""
    kwargs = dict(request.kwargs)
    said: list[dict[str, Any]] = []
    for name in ("system", "instructions"):
        if name in kwargs:
            said.append(_message({"role": "system", "content": kwargs.pop(name)}))
    messages = kwargs.pop("messages", None)
    if messages is None:
        messages = kwargs.pop("input", None)
    if messages is None:  # a decision of the user's own: its first list of messages
        lists = [a for a in request.args if isinstance(a, list)]
        messages = lists[0] if lists else None
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if isinstance(messages, list):
        said.extend(_message(m) for m in messages)
    if request.args:
        kwargs = {"args": list(request.args), **kwargs}
    return said, kwargs


def _message(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        return {"role": "?", "text": json.dumps(m, ensure_ascii=False), "tool_calls": []}
    kind = m.get("type")
    role = str(m.get("role") or ("tool" if kind == "function_call_output" else "assistant"))
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    content = m.get("content", m.get("output"))
    if isinstance(content, str):
        texts.append(content)
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            texts.append(str(block))
        elif isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(
                {"id": block.get("id"), "name": block.get("name"), "arguments": block.get("input")}
            )
        elif block.get("type") == "tool_result":
            role, result = "tool", block.get("content")
            texts.append(
                result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
            )
    for call in m.get("tool_calls") or ():
        if isinstance(call, dict):
            function = call.get("function") or {}
            calls.append(
                {
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": parsed_arguments(function.get("arguments")),
                }
            )
    if kind == "function_call":
        calls.append(
            {
                "id": m.get("call_id"),
                "name": m.get("name"),
                "arguments": parsed_arguments(m.get("arguments")),
            }
        )
    message = {"role": role, "text": "\n".join(texts) or None, "tool_calls": calls}
    if m.get("tool_call_id") or (m.get("call_id") and kind != "function_call"):
        message["answers"] = m.get("tool_call_id") or m.get("call_id")
    return message


def parsed_arguments(text: Any) -> Any:
    """A tool call's arguments: the JSON the model wrote, parsed when it parses (shown
    as the model wrote it otherwise: a call the model got wrong is evidence too). The
    request's calls and the reply's (contents.py) alike."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text
