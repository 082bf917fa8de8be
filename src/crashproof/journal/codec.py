"""JSON encoding, canonical digests and error records: the only way values are stored.

Stored values are plain JSON (never pickle). Digests that bind identity (a run's
input, a step's arguments, an act's intent) use RFC 8785 canonical JSON, so they
stay equal across Python versions, dict orders and crashproof releases.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import traceback
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import rfc8785

from crashproof.errors import SerializationError

__all__ = [
    "NO_ARGS_DIGEST",
    "args_digest",
    "ascii_json",
    "canonical_bytes",
    "canonical_digest",
    "decode",
    "encode",
    "error_from_record",
    "error_record",
    "sha256_hex",
    "spelled_out_args_digest",
    "storable",
]


def sha256_hex(data: bytes) -> str:
    return _sha256(data).hexdigest()


_MAX_SAFE_INT = 2**53 - 1  # RFC 8785 / rfc8785: integers must be exact as IEEE doubles


def _compact_encoder(*, sort_keys: bool) -> Callable[[Any, int], Any]:
    """Compact, NaN-refusing JSON encoding, as a callable ``(value, 0)`` returning the
    text in chunks. ``json.dumps`` builds a new C encoder on every call (about 4 us of a
    6 us call for a small value); every journal write and every replayed call encodes,
    so build it once. Falls back to the pure-Python encoder where the C accelerator is
    missing."""
    if c_make_encoder is None:  # pragma: no cover - CPython always has it
        encoder = json.JSONEncoder(
            sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        return lambda value, _level: (encoder.encode(value),)

    def _refuse(value: Any) -> Any:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    # No cycle markers (building them costs as much as the encoding): a cyclic value
    # ends in RecursionError, which callers report like any other non-JSON value.
    make: Callable[[Any, int], Any] = c_make_encoder(
        None, _refuse, encode_basestring, None, ":", ",", sort_keys, False, False
    )
    return make


def builtin_sha256() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before) where the build has
    it, else hashlib's (also the Python seal's outer hash). For the few bytes of a
    call's arguments it is about a quarter cheaper than OpenSSL's, whose context is
    allocated, initialised and freed per digest (for long inputs OpenSSL's SHA
    instructions win). The same digest either way."""
    for name in ("_sha2", "_sha256"):
        try:
            sha256: Callable[[bytes], Any] = importlib.import_module(name).sha256
        except (ImportError, AttributeError):
            continue
        return sha256
    return hashlib.sha256


# Canonical arguments shorter than this fit one SHA-256 block (55 bytes and the padding):
# there CPython's own SHA-256 wins (16 bytes: 259 ns against OpenSSL's 303); from two
# blocks on OpenSSL's SHA instructions win (100 bytes: 329 against 436; 190: 390 against
# 789; Intel Xeon with SHA-NI, 2026-12-01).
_SHORT = 56
_short_sha256 = builtin_sha256()
_sorted_chunks = _compact_encoder(sort_keys=True)
_compact_chunks = _compact_encoder(sort_keys=False)
_join = "".join
_sha256 = hashlib.sha256


_NOT_PLAIN, _PLAIN, _PLAIN_BUT_FLOATS = 0, 1, 2


def _plain_kind(value: Any) -> int:
    """``_PLAIN`` when sorted, compact ``json.dumps`` is byte-for-byte RFC 8785 for
    ``value`` (UTF-8 encoded; a lone surrogate fails that encoding, and callers then take
    the rfc8785 path): strings (both escape exactly ``"``, ``\\`` and U+0000-U+001F, the
    same way, and write everything else as it is), ASCII keys (code-point order is UTF-16
    order there), safe ints, bools, None, and lists/tuples/str-keyed dicts of those.
    ``_PLAIN_BUT_FLOATS`` when it is so once its floats, all whole and safe, are written
    as ints (RFC 8785 writes ``0.0`` and ``-0.0`` as ``0``, ``2.0`` as ``2``: a usage
    record's ``0.0`` seconds, say). Other floats (ECMAScript number form), subclasses
    and anything else take the rfc8785 path. Iterative and bounded: this runs for every
    recorded call on every replay."""
    stack = [value]
    budget = 4096  # nodes; bigger (or cyclic) values take the rfc8785 path
    kind = _PLAIN
    while stack:
        budget -= 1
        if budget < 0:
            return _NOT_PLAIN
        v = stack.pop()
        t = type(v)
        if t is str:
            pass  # any text: json's escapes are RFC 8785's (tests/unit/test_digests.py)
        elif t is int:
            if not -_MAX_SAFE_INT <= v <= _MAX_SAFE_INT:
                return _NOT_PLAIN
        elif t is list or t is tuple:
            stack.extend(v)
        elif t is dict:
            for k, item in v.items():
                if type(k) is not str or not k.isascii():
                    return _NOT_PLAIN
                stack.append(item)
        elif t is float:
            if not (v.is_integer() and -_MAX_SAFE_INT <= v <= _MAX_SAFE_INT):
                return _NOT_PLAIN
            kind = _PLAIN_BUT_FLOATS
        elif v is not None and t is not bool:
            return _NOT_PLAIN
    return kind


def _floats_as_ints(value: Any) -> Any:
    """``value`` with its (whole, safe) floats as ints: the same RFC 8785 bytes."""
    t = type(value)
    if t is float:
        return int(value)
    if t is list or t is tuple:
        return [_floats_as_ints(v) for v in value]
    if t is dict:
        return {k: _floats_as_ints(v) for k, v in value.items()}
    return value


def canonical_digest(value: Any, *, what: str, key: str | None = None) -> str:
    """SHA-256 hex of the RFC 8785 canonical form of ``value``.

    ``what`` names the value in the error, e.g. "arguments of step", followed by
    ``key`` (quoted) when given: hot paths pass the key rather than format a message
    they almost never need.
    """
    return sha256_hex(canonical_bytes(value, what=what, key=key))


def canonical_bytes(value: Any, *, what: str, key: str | None = None) -> bytes:
    """The RFC 8785 canonical bytes of ``value`` (errors as ``canonical_digest``)."""
    kind = _plain_kind(value)
    if kind:  # the common case: 2x (ASCII) to 8x (other text) faster than rfc8785, the
        if kind == _PLAIN_BUT_FLOATS:  # same bytes (2.7 KB of French: 3.9 against 30.8
            value = _floats_as_ints(value)  # µs, 2026-12-02)
        try:
            return _join(_sorted_chunks(value, 0)).encode()
        except UnicodeEncodeError:  # a lone surrogate: rfc8785 refuses it below
            pass
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(
            f"{_named(what, key)} cannot be canonicalized as JSON ({exc}); nothing was "
            "recorded. Pass only JSON values (str, int within +/-2**53, float, bool, None, "
            "lists, dicts with str keys), or close over other objects in the function."
        ) from None


# The digest of "no arguments" (``args_digest((), {})``), the usual case of a step, computed
# once: replay compares it for every recorded call without arguments.
NO_ARGS_DIGEST = canonical_digest({"args": [], "kwargs": {}}, what="no arguments")


def _named(what: str, key: str | None) -> str:
    return what if key is None else f"{what} {key!r}"


def args_digest(
    args: tuple[Any, ...], kwargs: dict[str, Any], *, what: str, key: str | None = None
) -> str:
    """Digest of a call's arguments (format 1): ``canonical_digest({"args": [...],
    "kwargs": {...}})``. ``journal/transcript.py`` has format 2, for growing lists."""
    digest = spelled_out_args_digest(args, kwargs)
    if digest is not None:
        return digest
    return canonical_digest({"args": list(args), "kwargs": kwargs}, what=what, key=key)


def spelled_out_args_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """``args_digest`` of positional arguments that are safe ints, ASCII strings, bools or
    None (the usual case), spelled out directly in exactly the bytes RFC 8785 gives them;
    one such argument (the most usual case) without a loop. None for anything else.

    Replay computes it for every recorded call. Kept: ~1.3 µs, 8 % of a live step, 32 %
    of a replayed one, 6-7 % of a decision (bench/handbuilt.py, 2026-12-01)."""
    if kwargs:
        return None
    if len(args) == 1:
        arg = args[0]
        t = type(arg)
        if t is int and -_MAX_SAFE_INT <= arg <= _MAX_SAFE_INT:
            text = f'{{"args":[{arg}],"kwargs":{{}}}}'
            digest: str = _short_sha256(text.encode()).hexdigest()  # < 50 bytes
            return digest
        if t is str and arg.isascii():
            text = '{"args":[' + encode_basestring(arg) + '],"kwargs":{}}'
            sha = _short_sha256 if len(text) < _SHORT else _sha256
            return sha(text.encode()).hexdigest()
    parts = []
    for arg in args:
        t = type(arg)
        if t is int and -_MAX_SAFE_INT <= arg <= _MAX_SAFE_INT:
            parts.append(str(arg))
        elif t is str and arg.isascii():
            parts.append(encode_basestring(arg))
        elif arg is None or t is bool:
            parts.append(_LITERALS[arg])
        else:
            return None
    text = '{"args":[' + ",".join(parts) + '],"kwargs":{}}'
    sha = _short_sha256 if len(text) < _SHORT else _sha256
    return sha(text.encode()).hexdigest()


_LITERALS = {None: "null", True: "true", False: "false"}


def encode(value: Any, *, what: str, key: str | None = None) -> str:
    """Compact JSON text for storage; a clear SerializationError otherwise, naming
    ``what`` (and ``key``, quoted, when given)."""
    try:
        text: str = _join(_compact_chunks(value, 0))
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(
            f"{_named(what, key)} is not JSON-serializable ({exc}); nothing was recorded. "
            "Return JSON values (dict, list, str, int, float, bool, None) — crashproof "
            "never pickles."
        ) from None
    return text if text.isascii() or _is_utf8(text) else ascii_json(value)


def ascii_json(value: Any) -> str:
    """Compact JSON with every non-ASCII character escaped.

    Used when a string holds a lone surrogate (e.g. a file name decoded with
    ``surrogateescape``): such text cannot be stored as UTF-8, but its ``\\udcxx``
    escape can, and ``json.loads`` gives back the very same string.
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def storable(text: str) -> bool:
    """Whether every store can keep ``text`` as it is, as a name or an id: no NUL
    (PostgreSQL's text refuses it) and UTF-8 (no lone surrogate, which no database holds)."""
    return "\x00" not in text and (text.isascii() or _is_utf8(text))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode(text: str | bytes) -> Any:
    """Parse stored JSON. Calls the C scanner directly: ``json.loads`` adds about 1.5 us
    of Python around it, and replay decodes twice per recorded call. Anything unusual
    (bytes, whitespace, trailing data, invalid text) goes through ``json.loads``, which
    also produces the proper error."""
    try:
        value, end = _scan_once(text, 0)  # type: ignore[arg-type]  # bytes: TypeError
    except (StopIteration, TypeError):
        return json.loads(text)
    if end == len(text):
        return value
    return json.loads(text)


# A recorded failure keeps the end of its traceback (the frames nearest the error): enough
# to find the line, bounded so that a step retried many times stays small.
_TRACEBACK = 4000


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
    if exc.__traceback__ is not None:  # evidence for a person; replay never reads it
        text = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
        record["traceback"] = text if len(text) <= _TRACEBACK else "…" + text[-_TRACEBACK:]
    if isinstance(exc, OSError):  # its filename is not in args, but is in its message
        os_args = [exc.errno, exc.strerror, exc.filename, exc.filename2]
        try:
            json.dumps(os_args, allow_nan=False)
            record["os_args"] = os_args
        except (TypeError, ValueError):
            pass
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
            os_args = record.get("os_args")
            if issubclass(obj, OSError) and isinstance(os_args, list) and len(os_args) == 4:
                args = os_args[: 2 + sum(1 for a in os_args[2:] if a is not None)]
            try:
                exc = obj(*args)
            except Exception:
                # Its constructor does not take its own args back (it formats its message
                # from other parameters). Rebuild it without __init__: what replay must
                # keep is the type (``except`` clauses match on it) and the message.
                exc = obj.__new__(obj, *args)
                exc.args = tuple(args)
            message = str(record.get("message", ""))
            if str(exc) == message:
                return exc
            return _with_recorded_message(obj, tuple(args), message)
    except Exception:  # noqa: S110 - any failure to rebuild falls back to RecordedError
        pass
    return RecordedError(record)


_MESSAGE_KEEPERS: dict[type[Exception], type[Exception]] = {}


def _with_recorded_message(
    cls: type[Exception], args: tuple[Any, ...], message: str
) -> BaseException:
    """An instance of a subclass of ``cls`` whose str() is the recorded message: the
    workflow's ``except cls`` still matches, and what it reads from the error is what the
    first run read."""
    keeper = _MESSAGE_KEEPERS.get(cls)
    if keeper is None:
        keeper = type(
            cls.__name__,
            (cls,),
            {"__str__": lambda self: str(getattr(self, "_crashproof_message", ""))},
        )
        keeper.__qualname__ = cls.__qualname__
        keeper.__module__ = cls.__module__
        _MESSAGE_KEEPERS[cls] = keeper
    exc = keeper.__new__(keeper, *args)
    exc.args = args
    exc._crashproof_message = message  # type: ignore[attr-defined]
    return exc
