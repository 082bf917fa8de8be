"""Arguments digest format 2: a growing list costs its new elements only.

Format 1 (``codec.args_digest``) is the SHA-256 of the RFC 8785 form of
``{"args": [...], "kwargs": {...}}``: an agent loop that passes its whole message history
each turn pays for every byte of it, every turn, and again on replay. Format 2 is used
for a call with at least one top-level list or tuple argument (positional or keyword),
and is spelled ``"a2:" + hex``::

    element(x)  = SHA-256(RFC 8785 bytes of x)
    chain([])   = SHA-256(b"crashproof list v2")
    chain(l+[x]) = SHA-256(chain(l) || element(x))           (32 + 32 bytes)
    part(v)     = "l:" + hex(chain(v))   when v is a list or tuple (or a Transcript)
                  "j:" + hex(element(v)) otherwise
    digest      = "a2:" + hex(SHA-256(RFC 8785 bytes of
                  {"args": [part(a), ...], "kwargs": {k: part(v), ...}}))

Every byte of every argument is still bound (SHA-256 all the way down), but the chain of
a list is a prefix state: appending to a list digested before costs the new elements
only. ``digest_v2`` computes it from scratch (the specification and the reference of
the tests); ``runtime/steps/arguments.py`` computes it incrementally, and ``Transcript``
is an append-only list that keeps its own chain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, NoReturn

from crashproof.journal.codec import canonical_bytes, canonical_digest

__all__ = [
    "LIST_SEED",
    "Transcript",
    "V2",
    "canonicalised_bytes",
    "chain",
    "digest_v2",
    "element",
    "element_and_bytes",
    "is_list",
    "v2_of_parts",
]

V2 = "a2:"  # the prefix of a format-2 arguments digest (format 1: 64 bare hex digits)
LIST_SEED = hashlib.sha256(b"crashproof list v2").digest()
_sha256 = hashlib.sha256
# isinstance with a prebuilt tuple: ``list | tuple`` builds a union at every call (~0.3 µs
# of ~0.5 here), and replay asks this of every argument of every call.
_LISTS = (list, tuple)
_CONTAINERS = (dict, list, tuple)
# Bytes canonicalised for format-2 digests in this process: the unit of digest work,
# read by the tests that prove a turn costs its new bytes only.
_work = [0]


def canonicalised_bytes() -> int:
    """How many bytes format-2 digests have canonicalised in this process so far."""
    return _work[0]


def element(value: Any, what: str, key: str | None = None) -> bytes:
    """SHA-256 (32 bytes) of one list element's RFC 8785 form."""
    data = canonical_bytes(value, what=what, key=key)
    _work[0] += len(data)
    return _sha256(data).digest()


def element_and_bytes(value: Any, what: str, key: str | None = None) -> tuple[bytes, bytes]:
    """``element`` and the RFC 8785 bytes it hashed (a stored request keeps them)."""
    data = canonical_bytes(value, what=what, key=key)
    _work[0] += len(data)
    return _sha256(data).digest(), data


def chain(state: bytes, element_digest: bytes) -> bytes:
    """The chain state after one more element."""
    return _sha256(state + element_digest).digest()


def is_list(value: Any) -> bool:
    """A top-level argument that format 2 digests as a chain of elements."""
    return isinstance(value, _LISTS)


def v2_of_parts(parts: list[str], named: dict[str, str]) -> str:
    """The format-2 digest of a call whose arguments' parts are known. Parts are ASCII
    ("l:"/"j:" and hex): with keyword names that are ASCII identifiers (nothing to
    escape, code-point order is UTF-16 order) the RFC 8785 text is spelled out here,
    byte for byte what ``canonical_digest`` gives (tests/unit/test_transcript_work.py);
    replay computes this once per recorded call."""
    names = tuple(named)
    order = _orders.get(names)
    if order is None:
        if not all(k.isascii() and k.isidentifier() for k in names):
            return V2 + canonical_digest({"args": parts, "kwargs": named}, what="argument digests")
        if len(_orders) >= 256:
            _orders.clear()
        order = _orders[names] = tuple(sorted(names))
    args = ",".join([f'"{p}"' for p in parts])
    kwargs = ",".join([f'"{k}":"{named[k]}"' for k in order])
    return V2 + _sha256(f'{{"args":[{args}],"kwargs":{{{kwargs}}}}}'.encode()).hexdigest()


# Keyword names spelled out by v2_of_parts (ASCII identifiers), in canonical order: a
# call site passes the same names each time. Bounded: cleared when full.
_orders: dict[tuple[str, ...], tuple[str, ...]] = {}


def digest_v2(args: tuple[Any, ...], kwargs: dict[str, Any], what: str = "arguments") -> str:
    """Format 2 from scratch: the specification (module docstring), no cache."""

    def part(value: Any) -> str:
        if not is_list(value):
            return "j:" + element(value, what).hex()
        state = LIST_SEED
        for item in value:
            state = chain(state, element(item, what))
        return "l:" + state.hex()

    return v2_of_parts([part(a) for a in args], {k: part(v) for k, v in kwargs.items()})


class _FrozenDict(dict[str, Any]):
    """A Transcript's copy of a JSON object: reads as a dict, refuses every change."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            "a message in a cp.Transcript cannot be changed (its digest was taken when it "
            "was appended); build a new message and append it, or use a plain list"
        )

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:  # copy/deepcopy: a plain dict to change
        return (dict, (dict(self),))


class _FrozenList(list[Any]):
    """A Transcript's copy of a JSON array inside a message: refuses every change."""

    _refuse = _FrozenDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


def _frozen(value: Any) -> Any:
    """A deep copy in which every dict and list refuses changes (leaves are immutable)."""
    if isinstance(value, dict):
        frozen = _FrozenDict(value)  # a message's values are mostly strings: kept as they are
        for k, v in frozen.items():
            if isinstance(v, _CONTAINERS):
                dict.__setitem__(frozen, k, _frozen(v))
        return frozen
    if isinstance(value, _LISTS):
        return _FrozenList(_frozen(v) for v in value)
    return value


class Transcript(list[Any]):
    """An append-only message list whose arguments digest costs O(1) per call.

    ``ctx.decide("turn", model, transcript)`` digests a plain list incrementally too,
    but must compare every earlier message with its copy to prove it unchanged (a
    pointer walk, ~0.1 µs per message); a Transcript is that proof: ``append`` and
    ``extend`` digest and freeze a copy of each new message (RFC 8785, once), and every
    other change, of the list or of a message in it, raises ``TypeError``. It is a
    ``list`` to everything else (SDKs, ``json``), and its digest is the same as the
    digest of a plain list with the same messages.
    """

    def __init__(self, messages: Iterable[Any] = ()) -> None:
        super().__init__()
        self._states = [LIST_SEED]  # the chain after 0, 1, ... messages
        # Each message's RFC 8785 bytes, as digested: a stored request holds the new ones
        # (runtime/steps/arguments.py) without canonicalising them a second time.
        self._bytes: list[bytes] = []
        self.extend(messages)

    @property
    def chain_state(self) -> bytes:
        """The chain (module docstring) over every message: 32 bytes."""
        return self._states[-1]

    def append(self, message: Any) -> None:
        """Add ``message`` (a JSON value; a frozen copy is kept): O(its size)."""
        digest, data = element_and_bytes(message, "a message of a cp.Transcript")
        super().append(_frozen(message))
        self._states.append(chain(self._states[-1], digest))
        self._bytes.append(data)

    def canonical(self, start: int = 0) -> list[bytes]:
        """The RFC 8785 bytes of the messages from ``start`` on, as they were digested."""
        return self._bytes[start:]

    def extend(self, messages: Iterable[Any]) -> None:
        for message in messages:
            self.append(message)

    def __iadd__(self, messages: Iterable[Any]) -> Transcript:  # type: ignore[misc]
        self.extend(messages)
        return self

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            "a cp.Transcript is append-only (its digest covers every earlier message): "
            "use append or extend, or copy it into a plain list (list(transcript))"
        )

    __setitem__ = __delitem__ = __imul__ = _refuse
    insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (Transcript, (list(self),))
