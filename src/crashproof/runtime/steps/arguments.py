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

Replay trusts what the journal proved (#42). That proof, made on every call, is O(T) a
turn and O(T²) a drive: 10,000 replayed turns compared 10^8 elements (~7 s). A call
matched against a recorded one is first digested on trust: when its list is at least
as long as the slot's last one and holds the very same object at the last digested
position, the prefix is taken as unchanged and only the new elements are digested.
That digest is accepted only if it equals the recorded digest, which the live drive
computed with the full proof; anything else (a rebuilt or shortened list, a message
changed in place that the live drive changed too) falls back to the full proof, so no
call that matches with the proof fails without it. What trust gives up: an in-place
The last recorded call of each name is always proven in full, so an in-place change
of an earlier message made on replay only (new code editing history) is still a
mismatch there, as the trust-free replay would find it at the first call after it
(tests/property/test_transcript_digest.py). What trust gives up: such a change that is
undone again before that last call is not reported (the calls in between return their
recorded results, which the change could not reach). Live calls always make the full
proof, so every digest a drive records is exact; and ``cp.replay_check``
(``ReplayContext``) never trusts, so it reports the undone change too.

A live decision's request is kept for a person to read (``runtime/operations/requests.py``):
while its lists are chained, the RFC 8785 bytes of their new elements are what it stores,
beside the count of elements it shares with the same slot's last stored request. The
prefix proof above is what makes that count safe; nothing old is canonicalised again
(except after a call whose request was not stored: then the whole list is stored).

A call is digested in the format of the record it is matched against (a run journaled
before format 2 replays as it was written); a new record takes format 2 when a
top-level argument is a list or tuple, format 1 otherwise (byte for byte as before).
The chosen format can only make a comparison fail, never pass: the two are spelled
differently (``a2:`` prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crashproof.journal.codec import (
    NO_ARGS_DIGEST,
    args_digest,
    canonical_bytes,
    spelled_out_args_digest,
)
from crashproof.journal.records import Event
from crashproof.journal.transcript import (
    LIST_SEED,
    V2,
    Transcript,
    chain,
    element,
    element_and_bytes,
    is_list,
    v2_of_parts,
)

__all__ = ["ArgumentDigests", "proven_elements", "written_in_format_1"]

_MAX_SLOTS = 64  # argument slots remembered per drive (names made per turn evict)
_DIGEST_FIELD = '"digest":"'
_SHORT_TEXT, _MAX_TEXTS = 256, 256
# How a record that stores its request ends, O(1), never decoded: the digest of the
# request kept beside it is its last field (schema 9); or, in older journals, the request
# itself, a JSON text ending in "}" (no other field of a decision's record ends so).
_KEPT_FIELD, _KEPT_TAIL = ',"request_sha256":"', 66  # 64 hex digits and '"}'
_STORED_END = '}"}'
_LISTS = (list, tuple)  # prebuilt: ``list | tuple`` builds a union at every call


# Elements compared against their snapshots in this process (the prefix proofs): the
# unit of the proof's work, read by the tests that prove a replay is O(new) a call.
_proven = [0]


def proven_elements() -> int:
    """How many list elements prefix proofs have compared in this process so far."""
    return _proven[0]


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
        copy = dict(value)  # a message's values are mostly strings: shared as they are
        for k, v in copy.items():
            if type(v) is not str and v is not None:
                copy[k] = _snapshot(v)
        return copy
    if isinstance(value, _LISTS):
        return [_snapshot(v) for v in value]
    return _Exact(value)


class _Slot:
    __slots__ = ("last", "size", "snapshots", "states", "stored")

    def __init__(self) -> None:
        self.snapshots: list[Any] = []
        self.states: list[bytes] = [LIST_SEED]  # the chain after 0, 1, ... elements
        self.last: Any = None  # the object last digested (held: its id stays its own)
        # The list last digested is a stored request's (recorded with it, or replayed):
        # the next stored request may hold only what it adds.
        self.stored = False
        self.size = 0  # a Transcript's length when last digested (its chain is its own)


class ArgumentDigests:
    """The arguments digests of one drive's calls (a Context holds one). ``trusting``:
    a call matched against a recorded one may skip the prefix proof (module docstring)."""

    def __init__(self, journal: Sequence[Event] = (), *, trusting: bool = True) -> None:
        self._slots: dict[tuple[str, int | str], _Slot] = {}
        self.trusting = trusting
        self._journal = journal  # the drive's recorded calls, in order
        self._last: dict[str, Event] | None = None  # per name: its last recorded call
        # The parts of short strings passed beside a list (a model's name): the same
        # few every call. Bounded: cleared when full.
        self._texts: dict[str, str] = {}
        # A kept call's parts of its request (live), the slots it digested, and the
        # request of the latest live kept call: (key, text), taken by its record.
        self._capture: list[str] | None = None
        self._touched: list[_Slot] = []
        self.request: tuple[str, str] | None = None
        self._keeping = False
        self._said: dict[str, str] = {}  # the same short texts' JSON (a stored request's)

    def keeping(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        what: str,
        key: str,
        recorded: Event | None,
    ) -> str:
        """``of`` for a decision whose request is stored: a live one's is built
        (``request``, taken by ``take_request``), a replayed one's lists are the next
        one's base. (A separate method: ``of``, the path of every call when requests
        are not stored, does none of this.)"""
        self._touched, self._keeping = [], True
        self._capture = [] if recorded is None else None
        try:
            digest = self.of(name, args, kwargs, what, key, recorded)
            parts = self._capture
        finally:
            self._capture, self._keeping = None, False
        if parts is None:  # replayed: its lists are the next one's base if it stored them
            text = recorded.payload_json if recorded is not None else None
            if text is not None and (
                text[-_KEPT_TAIL - len(_KEPT_FIELD) : -_KEPT_TAIL] == _KEPT_FIELD
                or text.endswith(_STORED_END)
            ):
                self._kept()
            else:
                self._touched = []
        else:
            self.request = (key, _request_text(digest, parts, args, kwargs, what, key))
        return digest

    def take_request(self, key: str) -> str | None:
        """The request of the live call ``key``, as its record stores it; its lists are
        then the base of the next stored requests."""
        request, self.request = self.request, None
        if request is None or request[0] != key:
            return None
        self._kept()
        return request[1]

    def _kept(self) -> None:
        for slot in self._touched:
            slot.stored = True
        self._touched = []

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
        if self.trusting and recorded is not None and not self._last_of(name, recorded):
            wanted = _recorded_digest(recorded)
            trusted = self._digest(name, args, kwargs, what, key, True)
            if trusted == wanted:  # what the live drive proved: the prefix is unchanged
                return trusted
        return self._digest(name, args, kwargs, what, key, False)

    def _last_of(self, name: str, recorded: Event) -> bool:
        """Whether ``recorded`` is the last recorded call named ``name`` (proven in full)."""
        last = self._last
        if last is None:  # once a drive, on its first trusted call: O(journal)
            last = self._last = {e.key.partition("#")[0]: e for e in self._journal if e.key}
        return last.get(name) is recorded

    def _digest(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        what: str,
        key: str,
        trust: bool,
    ) -> str:
        parts = [self._part(name, i, a, what, key, trust) for i, a in enumerate(args)]
        named = {k: self._part(name, k, v, what, key, trust) for k, v in kwargs.items()}
        return v2_of_parts(parts, named)

    def _part(
        self, name: str, slot: int | str, value: Any, what: str, key: str, trust: bool
    ) -> str:
        capture = self._capture
        if capture is not None:  # a kept live call: its parts' bytes are its request
            return self._captured(name, slot, value, what, key, capture)
        if not is_list(value):
            if type(value) is not str or len(value) > _SHORT_TEXT:
                return "j:" + element(value, what, key).hex()
            return self._texts.get(value) or self._short(value, what, key)
        if type(value) is Transcript:
            if self._keeping:  # a replayed kept call: the next stored request's base
                self._transcript(name, slot, value)
            return "l:" + value.chain_state.hex()
        return "l:" + self._chain(name, slot, value, what, key, trust).hex()

    def _short(self, value: str, what: str, key: str) -> str:
        """A short text's part, and its JSON for a stored request: canonicalised once."""
        if len(self._texts) >= _MAX_TEXTS:
            self._texts.clear()
            self._said.clear()
        digest, data = element_and_bytes(value, what, key)
        self._said[value] = data.decode()
        part = self._texts[value] = "j:" + digest.hex()
        return part

    def _captured(
        self, name: str, slot: int | str, value: Any, what: str, key: str, capture: list[str]
    ) -> str:
        """``_part`` of a kept live call, its part of the request added to ``capture``."""
        if not is_list(value):
            if type(value) is str and len(value) <= _SHORT_TEXT:  # a model's name
                part = self._texts.get(value) or self._short(value, what, key)
                capture.append(f'{{"v":{self._said[value]}}}')
                return part
            digest, data = element_and_bytes(value, what, key)
            capture.append(f'{{"v":{data.decode()}}}')
            return "j:" + digest.hex()
        if type(value) is Transcript:  # its chain is its own: stored whole (its slot below)
            cached = self._slot(name, slot)
            base = cached.size if cached.stored and cached.last is value else 0
            self._transcript(name, slot, value)
            capture.append(_list_part(base, value.canonical(base)))  # digested bytes
            return "l:" + value.chain_state.hex()
        sink: list[bytes] = []
        state = self._chain(name, slot, value, what, key, False, sink)
        capture.append(_list_part(sink.pop(), sink))  # type: ignore[arg-type]
        return "l:" + state.hex()

    def _transcript(self, name: str, slot: int | str, value: Transcript) -> None:
        """A kept call's Transcript in ``slot``: the next stored request's base is its
        length (a plain list there next is stored whole: its snapshot is dropped)."""
        cached = self._slot(name, slot)
        cached.last, cached.size, cached.stored = value, len(value), False
        if cached.snapshots:
            cached.snapshots.clear()
            del cached.states[1:]
        self._touched.append(cached)

    def _slot(self, name: str, slot: int | str) -> _Slot:
        cached = self._slots.pop((name, slot), None)
        if cached is None:
            cached = _Slot()
            if len(self._slots) >= _MAX_SLOTS:
                del self._slots[next(iter(self._slots))]  # the least recently used
        self._slots[(name, slot)] = cached  # most recently used: last
        return cached

    def _chain(
        self,
        name: str,
        slot: int | str,
        items: Any,
        what: str,
        key: str,
        trust: bool,
        sink: list[Any] | None = None,
    ) -> bytes:
        cached = self._slot(name, slot)
        stored = cached.stored
        if self._keeping:
            cached.stored = False
            self._touched.append(cached)
        snapshots, states = cached.snapshots, cached.states
        n = len(snapshots)
        if trust and n and len(items) >= n and items[n - 1] is cached.last:
            return self._extend(cached, items, n, what, key)  # O(new): on trust
        items = items if type(items) is list else list(items)
        _proven[0] += n
        if len(items) < n or items[:n] != snapshots:  # O(n) pointer work, in C
            n = 0
            for new, old in zip(items, snapshots, strict=False):
                if new != old:
                    break
                n += 1
            del snapshots[n:], states[n + 1 :]
        if sink is None:
            return self._extend(cached, items, n, what, key)
        # A kept call: the new elements' bytes, after the stored base's (the base's own
        # bytes canonicalised again only when the slot's last list was not stored).
        base = n if stored else 0
        sink.extend(canonical_bytes(v, what=what, key=key) for v in items[base:n])
        state = states[n]
        for item in items[n:]:
            digest, data = element_and_bytes(item, what, key)
            state = chain(state, digest)
            sink.append(data)
            snapshots.append(_snapshot(item))
            states.append(state)
        cached.last = items[-1] if len(items) else None
        sink.append(base)  # last: the base (popped by _captured)
        return state

    @staticmethod
    def _extend(cached: _Slot, items: Any, n: int, what: str, key: str) -> bytes:
        """The chain over ``items`` whose first ``n`` are the slot's: the new elements
        canonicalised once, snapshot and chained."""
        snapshots, states = cached.snapshots, cached.states
        state = states[n]
        for item in items[n:]:
            state = chain(state, element(item, what, key))
            snapshots.append(_snapshot(item))
            states.append(state)
        cached.last = items[-1] if len(items) else None
        return state


def _list_part(base: int, new: list[bytes]) -> str:
    return f'{{"base":{base},"new":[{b",".join(new).decode()}]}}'


def _request_text(
    digest: str,
    parts: list[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    key: str,
) -> str:
    """A kept call's request as stored (``runtime/operations/requests.py`` reads it): format
    2, the parts captured while digesting; format 1 (no list), the arguments whole."""
    if not digest.startswith(V2):
        parts = [f'{{"v":{canonical_bytes(v, what=what, key=key).decode()}}}' for v in args]
        parts += [
            f'{{"v":{canonical_bytes(v, what=what, key=key).decode()}}}' for v in kwargs.values()
        ]
    n = len(args)
    named = ",".join(
        f"{canonical_bytes(k, what=what, key=key).decode()}:{p}"
        for k, p in zip(kwargs, parts[n:], strict=True)
    )
    form = 2 if digest.startswith(V2) else 1
    return f'{{"f":{form},"args":[{",".join(parts[:n])}],"kwargs":{{{named}}}}}'


def _has_list(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(map(is_list, args)) or any(map(is_list, kwargs.values()))


def _recorded_digest(recorded: Event) -> str | None:
    """A recorded call's arguments digest, read from the stored text where it can be."""
    text = recorded.payload_json
    if text is not None:
        at = text.find(_DIGEST_FIELD)
        if at >= 0:
            at += len(_DIGEST_FIELD)
            return text[at : text.find('"', at)]
    digest = recorded.payload.get("digest")
    return digest if isinstance(digest, str) else None


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
