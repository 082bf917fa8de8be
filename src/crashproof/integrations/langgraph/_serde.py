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

from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict
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


def _to_json(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise cp.SerializationError(f"{where}: {value!r} has no JSON form; store a string")
        return value
    if isinstance(value, list):
        return [_to_json(v, where) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise cp.SerializationError(
                    f"{where}: a dict key {k!r} ({type(k).__name__}) has no JSON form; "
                    "use string keys"
                )
            out[k] = _to_json(v, where)
        return {_TAG: "dict", "items": out} if _TAG in out else out
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


def encode_item(value: Any, where: str) -> str:
    """The JSON text of one value (compact, stable key order as given)."""
    return json.dumps(_to_json(value, where), ensure_ascii=False, separators=(",", ":"))


def encode(value: Any, where: str) -> str:
    return encode_item(value, where)


def decode(text: str) -> Any:
    return _from_json(json.loads(text))


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
