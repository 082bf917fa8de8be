"""A call's arguments digest, with growing lists digested incrementally (format 2).

Format 2 (``journal/transcript.py``) digests each top-level list argument as a chain of
element digests. A Context keeps, per argument slot (the step name and the position or
keyword), the chain states and a snapshot of the list it last digested: when the next
call's list begins with the same elements, only the new ones are canonicalised. The
agent loop's ``ctx.decide("turn", model, messages=history)`` thus canonicalises each
message once per drive, live and on replay.

The snapshot is the proof that the prefix is unchanged: a copy of every dict and list
of the elements, sharing their (immutable) strings, with numbers and booleans wrapped
so that ``True`` never equals ``1``. One C-level ``==`` of the snapshot against the new
list compares containers and string identities, never string bytes: O(messages), ~0.1
µs each, instead of O(bytes). A ``cp.Transcript`` is append-only and frozen, so its
chain is taken as is: O(1).

A call is digested in the format of the record it is matched against (a run journaled
before format 2 replays as it was written); a new record takes format 2 when a
top-level argument is a list or tuple, format 1 otherwise (byte for byte as before).
The chosen format can only make a comparison fail, never pass: the two are spelled
differently (``a2:`` prefix).
"""

from __future__ import annotations

from typing import Any

from crashproof.journal.codec import NO_ARGS_DIGEST, args_digest, spelled_out_args_digest
from crashproof.journal.records import Event
from crashproof.journal.transcript import (
    LIST_SEED,
    V2,
    Transcript,
    chain,
    element,
    is_list,
    v2_of_parts,
)

__all__ = ["ArgumentDigests", "written_in_format_1"]

_MAX_SLOTS = 64  # argument slots remembered per drive (names made per turn evict)
_DIGEST_FIELD = '"digest":"'


class _Exact:
    """A number or boolean in a snapshot: equal only to the same type and value (``==``
    alone says ``True == 1 == 1.0``, whose canonical forms differ)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self.value) and other == self.value

    __hash__ = None  # type: ignore[assignment]


def _snapshot(value: Any) -> Any:
    """Containers copied, strings and None shared, numbers and booleans wrapped. (An
    object whose ``__eq__`` claims equality with anything is no JSON value: out of scope.)"""
    t = type(value)
    if t is str or value is None:
        return value
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_snapshot(v) for v in value]
    return _Exact(value)


class _Slot:
    __slots__ = ("snapshots", "states")

    def __init__(self) -> None:
        self.snapshots: list[Any] = []
        self.states: list[bytes] = [LIST_SEED]  # the chain after 0, 1, ... elements


class ArgumentDigests:
    """The arguments digests of one drive's calls (a Context holds one)."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, int | str], _Slot] = {}

    def of(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        what: str,
        key: str,
        recorded: Event | None,
    ) -> str:
        """The digest of a call named ``name`` with these arguments, in the format of
        ``recorded`` (the record it is matched against; None: the current format)."""
        if not args and not kwargs:
            return NO_ARGS_DIGEST
        digest = spelled_out_args_digest(args, kwargs)  # scalars only: no list, format 1
        if digest is not None:
            return digest
        if not _has_list(args, kwargs) or (recorded is not None and written_in_format_1(recorded)):
            return args_digest(args, kwargs, what=what, key=key)
        parts = [self._part(name, i, a, what, key) for i, a in enumerate(args)]
        named = {k: self._part(name, k, v, what, key) for k, v in kwargs.items()}
        return v2_of_parts(parts, named)

    def _part(self, name: str, slot: int | str, value: Any, what: str, key: str) -> str:
        if not is_list(value):
            return "j:" + element(value, what, key).hex()
        if type(value) is Transcript:
            return "l:" + value.chain_state.hex()
        return "l:" + self._chain(name, slot, value, what, key).hex()

    def _chain(self, name: str, slot: int | str, items: Any, what: str, key: str) -> bytes:
        cached = self._slots.pop((name, slot), None)
        if cached is None:
            cached = _Slot()
            if len(self._slots) >= _MAX_SLOTS:
                del self._slots[next(iter(self._slots))]  # the least recently used
        self._slots[(name, slot)] = cached  # most recently used: last
        items = items if type(items) is list else list(items)
        snapshots, states = cached.snapshots, cached.states
        n = len(snapshots)
        if len(items) < n or items[:n] != snapshots:  # O(n) pointer work, in C
            n = 0
            for new, old in zip(items, snapshots, strict=False):
                if new != old:
                    break
                n += 1
            del snapshots[n:], states[n + 1 :]
        state = states[n]
        for item in items[n:]:  # the new elements: canonicalised once
            state = chain(state, element(item, what, key))
            snapshots.append(_snapshot(item))
            states.append(state)
        return state


def _has_list(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(map(is_list, args)) or any(map(is_list, kwargs.values()))


def written_in_format_1(recorded: Event) -> bool:
    """Whether a recorded call's arguments digest is format 1 (no ``a2:`` prefix),
    read from the stored text without decoding it where the runtime wrote it."""
    text = recorded.payload_json
    if text is not None:
        at = text.find(_DIGEST_FIELD)
        if at >= 0:
            return not text.startswith(V2, at + len(_DIGEST_FIELD))
    digest = recorded.payload.get("digest")
    return not (isinstance(digest, str) and digest.startswith(V2))
