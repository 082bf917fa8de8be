"""JSON encoding, canonical digests and error records: the only way values are stored.

Stored values are plain JSON (never pickle). Digests that bind identity (a run's
input, a step's arguments, an act's intent) use RFC 8785 canonical JSON, so they
stay equal across Python versions, dict orders and crashproof releases.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import rfc8785

from crashproof.errors import SerializationError

__all__ = [
    "ascii_json",
    "canonical_digest",
    "decode",
    "encode",
    "error_from_record",
    "error_record",
    "sha256_hex",
]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_digest(value: Any, *, what: str) -> str:
    """SHA-256 hex of the RFC 8785 canonical form of ``value``.

    ``what`` names the value in the error, e.g. "arguments of step 'plan'".
    """
    try:
        return sha256_hex(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what} cannot be canonicalized as JSON ({exc}); nothing was recorded. "
            "Pass only JSON values (str, int within +/-2**53, float, bool, None, "
            "lists, dicts with str keys), or close over other objects in the function."
        ) from None


def encode(value: Any, *, what: str) -> str:
    """Compact JSON text for storage; a clear SerializationError otherwise."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what} is not JSON-serializable ({exc}); nothing was recorded. "
            "Return JSON values (dict, list, str, int, float, bool, None) — crashproof "
            "never pickles."
        ) from None
    return text if _is_utf8(text) else ascii_json(value)


def ascii_json(value: Any) -> str:
    """Compact JSON with every non-ASCII character escaped.

    Used when a string holds a lone surrogate (e.g. a file name decoded with
    ``surrogateescape``): such text cannot be stored as UTF-8, but its ``\\udcxx``
    escape can, and ``json.loads`` gives back the very same string.
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode(text: str | bytes) -> Any:
    return json.loads(text)


def error_record(exc: BaseException) -> dict[str, Any]:
    """What is stored about an exception: enough to raise the same type and message again."""
    cls = type(exc)
    record: dict[str, Any] = {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc),
    }
    try:
        json.dumps(list(exc.args), allow_nan=False)
        record["args"] = list(exc.args)
    except (TypeError, ValueError):
        pass  # args that are not JSON are summarised by the message alone
    return record


class RecordedError(Exception):
    """Stands in for a recorded exception whose class cannot be rebuilt here."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        super().__init__(f"{record.get('type')}: {record.get('message')}")


def error_from_record(record: dict[str, Any]) -> BaseException:
    """Rebuild the recorded exception: same class and args, else a RecordedError.

    Only modules already imported are consulted: a journal never makes us import code.
    """
    path = str(record.get("type", ""))
    module_name, _, qualname = path.rpartition(".")
    try:
        obj: Any = sys.modules[module_name]
        for part in qualname.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, type) and issubclass(obj, Exception):
            args = record.get("args")
            args = args if isinstance(args, list) else [record.get("message", "")]
            try:
                exc = obj(*args)
            except Exception:
                # Its constructor does not take its own args back (it formats its message
                # from other parameters). Rebuild it without __init__: what replay must
                # keep is the type (``except`` clauses match on it) and the message.
                exc = obj.__new__(obj, *args)
                exc.args = tuple(args)
            if str(exc) == record.get("message"):
                return exc
    except Exception:  # noqa: S110 - any failure to rebuild falls back to RecordedError
        pass
    return RecordedError(record)
