"""The HMAC chain: every journal record is sealed over its exact stored bytes and the
MAC of the record before it, and is verified before anything parses it.

A plain checksum would not do: whoever can edit a payload can recompute a checksum.
An HMAC needs the key, which never enters the ledger. The chain (each MAC covers the
previous one) makes deleting, reordering or splicing records detectable; a journal cut
short at its end is caught by the generation witness instead.
"""

from __future__ import annotations

import hashlib
import hmac
import operator
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any, NamedTuple, TypeVar

from crashproof.errors import JournalTampered, UnknownKeyId
from crashproof.integrity.keys import Keyring
from crashproof.journal.codec import builtin_sha256

GENESIS = ""  # the previous MAC of a run's first record (store.port.GENESIS)
T = TypeVar("T")
_FIELDS = operator.itemgetter(slice(0, 8))  # what verify_chain reads of a stored row

__all__ = ["Sealer"]

_BLOCK = 64  # SHA-256's block size (RFC 2104)
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))

# The v2 MAC in native code (_seal.c), built where a compiler and OpenSSL's headers are:
# the message and HMAC of a record in one call, ~0.3 us instead of ~1.6-2 us in Python
# (docs/benchmarks.md). Without it every MAC below is computed in Python: the same bytes.
_native: ModuleType | None
try:
    from crashproof.integrity import _seal as _native
except ImportError:  # not built: the Python path
    _native = None

NATIVE = _native is not None  # whether this install seals in native code (bench, tests)


def _no_native(*fields: Any) -> str:
    raise TypeError("this install has no native seal")  # never called: native is None


# _seal.mac_v2, called only for a _Keyed whose native state is set.
_mac_v2: Callable[..., str] = _no_native if _native is None else _native.mac_v2


class _Keyed(NamedTuple):
    """A key's HMAC-SHA256 as two keyed SHA-256 states, copied per record: HMAC(K, m) =
    H(K^opad || H(K^ipad || m)). Two state copies per MAC instead of the four an OpenSSL
    HMAC object's copy and final take; hmac.digest() re-keys every time. ``native``: the
    same two states for _seal.mac_v2 (None without it, or when not asked for)."""

    inner: Callable[[], Any]
    outer: Callable[[], Any]
    native: bytes | None

    def __repr__(self) -> str:  # the states are as good as the key: never show them
        return "<keyed HMAC-SHA256 states>"


def _key_block(secret: bytes) -> bytes:
    """HMAC's key block (RFC 2104): a key longer than a block hashed, then zero-padded."""
    if len(secret) > _BLOCK:
        secret = hashlib.sha256(secret).digest()
    return secret.ljust(_BLOCK, b"\0")


def _keyed_state(secret: bytes, native: bool) -> _Keyed:
    block = _key_block(secret)
    # OpenSSL's SHA-256 for the whole record (its SHA instructions), CPython's own for
    # the outer hash, which absorbs one 32-byte digest: a memcpy to copy instead of an
    # OpenSSL context allocated, copied and freed. The same digest either way.
    inner = hashlib.sha256(block.translate(_IPAD))
    outer = _small_sha256(block.translate(_OPAD))
    state = _native.keyed_state(secret) if native and _native is not None else None
    return _Keyed(inner.copy, outer.copy, state)


_small_sha256 = builtin_sha256()


def _hmac_hex(keyed: _Keyed, message: bytes) -> str:
    inner = keyed.inner()
    inner.update(message)
    outer = keyed.outer()
    outer.update(inner.digest())
    mac: str = outer.hexdigest()
    return mac


# The MAC message formats. A record's stored MAC says which one it was sealed with: a
# bare hex MAC is v1 (every record written before v2: verified, never written again),
# "v2:" + hex is v2. A new format needs a new name and a new marker.
_PREFIX = "crashproof-record-v1"
_PREFIX_V2 = "crashproof-record-v2"
V2 = "v2:"


def _message(
    run_id: str,
    seq: int,
    type_: str,
    key: str | None,
    payload: str,
    value: str | None,
    created_at: float,
    prev_mac: str,
) -> bytes:
    """The v1 message: every field behind its length, so no two different records share
    a message. (Lengths count characters of the one string that is then encoded: still
    unambiguous, and a single f-string is 5x cheaper than packing each field.)"""
    k = "-" if key is None else f"{len(key)}:{key}"
    v = "-" if value is None else f"{len(value)}:{value}"
    text = (
        f"{_PREFIX}|{len(run_id)}:{run_id}|{seq}|{type_}|{k}|"
        f"{len(payload)}:{payload}|{v}|{created_at!r}|{prev_mac}"
    )
    return text.encode("utf-8", "surrogatepass")


def _message_v2(
    run_id: str,
    seq: int,
    type_: str,
    key: str | None,
    payload: str,
    value: str | None,
    created_at: float,
    prev_mac: str,
) -> bytes:
    """The v2 message: as v1, every field behind its length (-1 and the text "None" for
    a missing key or value), but the timestamp as ``float.hex`` (exact, and a fifth of
    ``repr``'s cost) and one flat f-string: about 40 % cheaper to build than v1, and it
    is built for every record written and every record read."""
    return _utf8(
        f"{_PREFIX_V2}|{len(run_id)}:{run_id}|{seq}|{type_}|"
        f"{-1 if key is None else len(key)}:{key}|{len(payload)}:{payload}|"
        f"{-1 if value is None else len(value)}:{value}|{_stamp(created_at)}|{prev_mac}"
    )


def _stamp(created_at: float) -> str:
    """A timestamp as v2 seals it: ``float.hex`` (an int as the float it is stored as)."""
    if type(created_at) is float:
        return created_at.hex()
    if isinstance(created_at, int | float) and not isinstance(created_at, bool):
        try:
            return float(created_at).hex()
        except OverflowError:
            pass
    return repr(created_at)  # not a number: matches no sealed record


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (a checkpoint's "\udcxx" escape)
        return text.encode("utf-8", "surrogatepass")


class Sealer:
    """Seals records with the keyring's current key; verifies with whichever key sealed."""

    def __init__(self, keyring: Keyring, *, native: bool = True) -> None:
        """``native=False`` computes every MAC in Python even where _seal is built (the
        tests and bench/integrity.py compare the two)."""
        self.keyring = keyring
        self.native = native and _native is not None
        # Keyed HMAC states by key id, copied per record (_keyed_state).
        self._states: dict[str, _Keyed] = {}
        # What seal() uses for every record written: the current key's id and states.
        self._current_id = keyring.current_id
        self._current = self._state(keyring.current_id, keyring.current)
        # seal()'s message up to the record's own fields, for the run sealed last: a run's
        # records are usually sealed one after another.
        self._head: tuple[str | None, str] = (None, "")

    def _state(self, kid: str, secret: bytes) -> _Keyed:
        state = self._states.get(kid)
        if state is None:
            state = self._states[kid] = _keyed_state(secret, self.native)
        return state

    def _mac(self, kid: str, secret: bytes, message: bytes) -> str:
        return _hmac_hex(self._state(kid, secret), message)

    def seal(
        self,
        run_id: str,
        seq: int,
        type_: str,
        key: str | None,
        payload: str,
        value: str | None,
        created_at: float,
        prev_mac: str,
    ) -> tuple[str, str]:
        """(key id, MAC) for a record about to be stored: ``"v2:"`` and the HMAC hex of
        its v2 message (_message_v2, inlined: this runs for every record written)."""
        keyed = self._current
        if keyed.native is not None:
            try:
                return self._current_id, _mac_v2(
                    keyed.native, run_id, seq, type_, key, payload, value, created_at, prev_mac
                )
            except (TypeError, UnicodeEncodeError):  # unusual fields: Python decides below
                pass
        cached = self._head  # one read: another thread may seal another run meanwhile
        if cached[0] != run_id:  # the run's part of the message, once per run
            cached = self._head = (run_id, f"{_PREFIX_V2}|{len(run_id)}:{run_id}|")
        try:
            text = (
                f"{cached[1]}{seq}|{type_}|"
                f"{-1 if key is None else len(key)}:{key}|{len(payload)}:{payload}|"
                f"{-1 if value is None else len(value)}:{value}|{created_at.hex()}|{prev_mac}"
            ).encode()
        except (AttributeError, TypeError, UnicodeEncodeError):  # not a float, a surrogate
            text = _message_v2(run_id, seq, type_, key, payload, value, created_at, prev_mac)
        inner = keyed.inner()
        inner.update(text)
        outer = keyed.outer()
        outer.update(inner.digest())
        return self._current_id, f"{V2}{outer.hexdigest()}"

    def verify(
        self,
        run_id: str,
        seq: int,
        type_: str,
        key: str | None,
        payload: str,
        value: str | None,
        created_at: float,
        prev_mac: str,
        key_id: str | None,
        mac: str | None,
    ) -> None:
        """Raise unless the stored record is exactly what was sealed, after ``prev_mac``."""
        if not key_id or not mac or not isinstance(mac, str):
            raise JournalTampered(
                f"run {run_id!r} record {seq} carries no MAC: it was not written by a sealing "
                "crashproof, or its MAC was removed; nothing was executed"
            )
        secret = self.keyring.get(key_id)
        if secret is None:
            raise UnknownKeyId(
                f"run {run_id!r} record {seq} was sealed with key id {key_id}, which this "
                f"keyring does not hold (it has {self.keyring.current_id}); wrong key? "
                "Nothing was executed."
            )
        if mac.startswith(V2):
            message = _message_v2(run_id, seq, type_, key, payload, value, created_at, prev_mac)
            expected = V2 + self._mac(key_id, secret, message)
        else:
            message = _message(run_id, seq, type_, key, payload, value, created_at, prev_mac)
            expected = self._mac(key_id, secret, message)
        if not hmac.compare_digest(expected, mac):
            raise JournalTampered(
                f"run {run_id!r} record {seq} does not match its MAC: the record was altered, "
                "moved, copied from elsewhere, or a record before it was removed; nothing was "
                "executed. Restore the ledger from a backup."
            )

    def verify_chain(self, run_id: str, records: Iterable[Sequence[Any]], prev_mac: str) -> str:
        """Verify a run's records in order, each chained to the one before (``prev_mac``
        for the first); returns the last MAC. ``records``: rows that start with (seq,
        type, key, payload, value, created_at, key_id, mac), exactly as stored. The same
        check as :meth:`verify` per record, in one loop (replay verifies every record of
        a journal); any record the loop cannot vouch for is checked by ``verify``, which
        accepts it or raises its error."""
        return self._chain(run_id, map(_FIELDS, records), prev_mac, None, [])

    def verify_rows(
        self, run_id: str, records: Iterable[Sequence[Any]], make: Callable[..., T]
    ) -> list[T]:
        """:meth:`verify_chain` from the run's first record, and what ``make(run_id, seq,
        type, key, payload, created_at, value)`` builds of each record once it verified
        (in the same loop: a store's load reads every record once). ``records``: exactly
        (seq, type, key, payload, value, created_at, key_id, mac)."""
        built: list[T] = []
        self._chain(run_id, records, GENESIS, make, built)
        return built

    def verify_rows_from(
        self,
        run_id: str,
        records: Iterable[Sequence[Any]],
        make: Callable[..., T],
        prev_mac: str,
    ) -> tuple[list[T], str]:
        """:meth:`verify_rows` of records that follow one whose MAC is ``prev_mac`` (the
        run's first: ``GENESIS``), and the last MAC (``prev_mac`` when there are none)."""
        built: list[T] = []
        return built, self._chain(run_id, records, prev_mac, make, built)

    def _chain(
        self,
        run_id: str,
        records: Iterable[Sequence[Any]],
        prev_mac: str,
        make: Callable[..., T] | None,
        built: list[T],
    ) -> str:
        states: dict[Any, _Keyed] = {}
        # The key of the record before: a journal is almost always sealed with one key,
        # and comparing two key ids is cheaper than hashing each row's new one.
        last_id: Any = None
        last: _Keyed | None = None
        compare = hmac.compare_digest
        # _message_v2, _message and _hmac_hex, inlined with the run's part of the message
        # formatted once (or _seal.mac_v2 where built): this loop runs for every record of
        # every journal read (tests/unit/test_seal_chain.py pins it to seal and verify).
        head = f"{_PREFIX_V2}|{len(run_id)}:{run_id}|"
        head_v1 = f"{_PREFIX}|{len(run_id)}:{run_id}|"
        for record in records:
            seq, type_, key, payload, value, created_at, key_id, mac = record
            keyed = last if key_id == last_id else states.get(key_id)
            if keyed is not None:
                try:  # anything unusual (no MAC, no float, a surrogate): verify() decides
                    v2 = mac[:3] == V2
                    if v2 and keyed.native is not None:
                        sound = compare(
                            _mac_v2(
                                keyed.native,
                                run_id,
                                seq,
                                type_,
                                key,
                                payload,
                                value,
                                created_at,
                                prev_mac,
                            ),
                            mac,
                        )
                    elif v2:
                        inner = keyed[0]()
                        inner.update(
                            f"{head}{seq}|{type_}|{-1 if key is None else len(key)}:{key}|"
                            f"{len(payload)}:{payload}|{-1 if value is None else len(value)}:"
                            f"{value}|{created_at.hex()}|{prev_mac}".encode()
                        )
                        outer = keyed[1]()
                        outer.update(inner.digest())
                        sound = compare(outer.hexdigest(), mac[3:])
                    else:
                        inner = keyed[0]()
                        inner.update(
                            f"{head_v1}{seq}|{type_}|"
                            f"{'-' if key is None else f'{len(key)}:{key}'}|"
                            f"{len(payload)}:{payload}|"
                            f"{'-' if value is None else f'{len(value)}:{value}'}|"
                            f"{created_at!r}|{prev_mac}".encode("utf-8", "surrogatepass")
                        )
                        outer = keyed[1]()
                        outer.update(inner.digest())
                        sound = compare(outer.hexdigest(), mac)
                except (AttributeError, TypeError, UnicodeEncodeError):
                    sound = False
            else:
                sound = False
            if not sound:  # the first record of a key, or one the loop cannot vouch for
                self.verify(
                    run_id, seq, type_, key, payload, value, created_at, prev_mac, key_id, mac
                )
                keyed = states[key_id] = self._state(str(key_id), self.keyring.get(key_id) or b"")
                last_id, last = key_id, keyed
            if make is not None:
                built.append(make(run_id, seq, type_, key, payload, created_at, value))
            prev_mac = mac
        return prev_mac
