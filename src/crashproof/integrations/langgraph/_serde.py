"""The JSON serde of CrashproofSaver: no pickle, no msgpack, no import by name.

What JSON holds natively round-trips as JSON. A few shapes LangGraph keeps in state and
writes are tagged (``{"__cp__": tag, ...}``) from a fixed list: tuples, bytes, LangChain
messages (through ``messages_to_dict``/``messages_from_dict``, which map a message type to
its class from a closed table), ``Send``, ``Interrupt``, and the exception of an ERROR
write (read back as ``StoredError``: type name and message, never the original class).
Anything else raises ``cp.SerializationError`` naming the type, before anything is
written.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    ChatMessageChunk,
    FunctionMessage,
    FunctionMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    RemoveMessage,
    SystemMessage,
    SystemMessageChunk,
    ToolMessage,
    ToolMessageChunk,
    messages_from_dict,
    messages_to_dict,
)
from langgraph.types import Interrupt, Send

import crashproof as cp

__all__ = ["JsonSerde", "StoredError", "decode", "encode", "encode_item"]

_TAG = "__cp__"


class StoredError(Exception):
    """An exception read back from a checkpoint: its type name and message (the
    original class is never imported from stored data)."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message


_LEAVES = frozenset({str, int, bool, type(None)})  # exact types JSON holds as they are


def _to_json(value: Any, where: str) -> Any:
    # The exact-type checks first, inline for a container's leaves: this walk was most
    # of a put's CPU (cProfile of bench/langgraph_saver.py); 400 chat messages encode in 5.6 ms
    # instead of 10.6 with the isinstance chain first.
    kind = type(value)
    if kind is dict:
        out: dict[str, Any] = {}
        for k, v in value.items():
            if type(k) is not str and not isinstance(k, str):
                raise cp.SerializationError(
                    f"{where}: a dict key {k!r} ({type(k).__name__}) has no JSON form; "
                    "use string keys"
                )
            out[k] = v if type(v) in _LEAVES else _to_json(v, where)
        return {_TAG: "dict", "items": out} if _TAG in out else out
    if kind is list:
        return [v if type(v) in _LEAVES else _to_json(v, where) for v in value]
    if kind in _LEAVES or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise cp.SerializationError(f"{where}: {value!r} has no JSON form; store a string")
        return value
    if isinstance(value, list):
        return [_to_json(v, where) for v in value]
    if isinstance(value, dict):
        return _to_json(dict(value), where)
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_to_json(v, where) for v in value]}
    if isinstance(value, bytes):
        return {_TAG: "bytes", "b64": base64.b64encode(value).decode()}
    if isinstance(value, BaseMessage):
        return {_TAG: "message", "data": _to_json(messages_to_dict([value])[0], where)}
    if isinstance(value, Send):
        return {_TAG: "send", "node": value.node, "arg": _to_json(value.arg, where)}
    if isinstance(value, Interrupt):
        return {_TAG: "interrupt", "value": _to_json(value.value, where), "id": value.id}
    if isinstance(value, BaseException):
        return {_TAG: "error", "type": type(value).__name__, "message": str(value)}
    raise cp.SerializationError(
        f"{where}: a {type(value).__module__}.{type(value).__qualname__} has no JSON form "
        "in CrashproofSaver (no pickle); keep plain data (dict, list, str, numbers, "
        "LangChain messages) in graph state. Nothing was written."
    )


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: _from_json(v) for k, v in value.items()}
    if tag == "dict":
        return {k: _from_json(v) for k, v in value["items"].items()}
    if tag == "tuple":
        return tuple(_from_json(v) for v in value["items"])
    if tag == "bytes":
        return base64.b64decode(value["b64"])
    if tag == "message":
        return messages_from_dict([_from_json(value["data"])])[0]
    if tag == "send":
        return Send(value["node"], _from_json(value["arg"]))
    if tag == "interrupt":
        return Interrupt(value=_from_json(value["value"]), id=value["id"])
    if tag == "error":
        return StoredError(str(value["type"]), str(value["message"]))
    raise cp.IntegrityError(f"a stored value carries an unknown tag {tag!r}; nothing was read")


def unchanged(value: Any, parsed: Any) -> bool:
    """Whether ``value``, a message whose text parsed as ``parsed``, still holds exactly
    those fields (a node may change a message in place): its text need not be made
    again. A deep comparison of plain values, no encoding: re-encoding the whole
    transcript at every put cost twice the CPU of SqliteSaver's put at 200 turns
    (bench/langgraph_saver.py), this check a tenth of it.
    Anything but a plain message (extra fields, a value that is not JSON) is encoded
    again. (``==`` holds 1 == 1.0 == True: a field changed only between those keeps
    its old text.)"""
    if type(value) not in _MESSAGE_TYPES or value.__pydantic_extra__:
        return False
    data = parsed.get("data") if type(parsed) is dict and parsed.get(_TAG) == "message" else None
    return type(data) is dict and value.__dict__ == data.get("data")


def encode_item(value: Any, where: str) -> str:
    """The JSON text of one value (compact, stable key order as given)."""
    return json.dumps(_to_json(value, where), ensure_ascii=False, separators=(",", ":"))


def encode(value: Any, where: str) -> str:
    return encode_item(value, where)


# LangChain's own table (messages_from_dict), closed: a stored type names one of these.
_MESSAGES: dict[str, type[BaseMessage]] = {
    "human": HumanMessage,
    "ai": AIMessage,
    "system": SystemMessage,
    "chat": ChatMessage,
    "function": FunctionMessage,
    "tool": ToolMessage,
    "remove": RemoveMessage,
    "AIMessageChunk": AIMessageChunk,
    "HumanMessageChunk": HumanMessageChunk,
    "FunctionMessageChunk": FunctionMessageChunk,
    "ToolMessageChunk": ToolMessageChunk,
    "SystemMessageChunk": SystemMessageChunk,
    "ChatMessageChunk": ChatMessageChunk,
}


_MESSAGE_TYPES = frozenset(_MESSAGES.values())


def _tagged(value: dict[str, Any]) -> Any:
    """json.loads's object hook: the dicts inside ``value`` are decoded already."""
    tag = value.get(_TAG)
    if tag is None:
        return value
    if tag == "message":
        kind = value["data"]["type"]
        cls = _MESSAGES.get(kind)
        if cls is None:
            raise cp.IntegrityError(f"a stored message has an unknown type {kind!r}")
        # model_construct, as LangGraph's own serde: the fields are the model_dump of a
        # validated message, and the seal was checked before this text was parsed. With
        # the object hook: 400 chat messages decode in 5.3 ms, 8-10 by the walk and
        # messages_from_dict (which validates each message again). (Filling __dict__
        # directly, as model_construct does, saved 1.7 ms more: under 1 ms of a 45 ms
        # turn at 200 turns, not worth leaning on pydantic's internals.)
        return cls.model_construct(**value["data"]["data"])
    if tag == "tuple":
        return tuple(value["items"])
    if tag == "bytes":
        return base64.b64decode(value["b64"])
    if tag == "send":
        return Send(value["node"], value["arg"])
    if tag == "interrupt":
        return Interrupt(value=value["value"], id=value["id"])
    if tag == "error":
        return StoredError(str(value["type"]), str(value["message"]))
    raise cp.IntegrityError(f"a stored value carries an unknown tag {tag!r}; nothing was read")


def decode(text: str) -> Any:
    # The object hook decodes bottom-up, which a user's dict holding the tag key (stored
    # escaped: {"__cp__": "dict", "items": {...}}) would confuse: such texts take the
    # top-down walk.
    if '"__cp__":"dict"' in text:
        return _from_json(json.loads(text))
    return json.loads(text, object_hook=_tagged)


class JsonSerde:
    """LangGraph's ``SerializerProtocol`` over the same JSON (type ``"json"``), for code
    that asks the saver's ``serde`` directly."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return "json", encode(obj, "a value").encode()

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, payload = data
        if type_ != "json":
            raise cp.SerializationError(
                f"CrashproofSaver reads JSON only, not {type_!r} (no pickle, no msgpack)"
            )
        return decode(payload.decode())

    def dumps(self, obj: Any) -> bytes:
        return self.dumps_typed(obj)[1]

    def loads(self, data: bytes) -> Any:
        return self.loads_typed(("json", data))
