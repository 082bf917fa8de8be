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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from crashproof.errors import JournalTampered, UnknownKeyId
from crashproof.integrity.keys import Keyring

__all__ = ["Sealer"]

_BLOCK = 64  # SHA-256's block size (RFC 2104)
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))

# A key's HMAC-SHA256 as two keyed SHA-256 states (inner, outer), each copied per
# record: HMAC(K, m) = H(K^opad || H(K^ipad || m)). Two state copies per MAC instead
# of the four an OpenSSL HMAC object's copy and final take (about 20 % less per record;
# hmac.digest() re-keys every time and costs twice as much). Same bytes: every stored
# MAC (tests/golden) still verifies.
_Keyed = tuple[Callable[[], Any], Callable[[], Any]]


def _keyed_state(secret: bytes) -> _Keyed:
    if len(secret) > _BLOCK:
        secret = hashlib.sha256(secret).digest()
    secret = secret.ljust(_BLOCK, b"\0")
    inner = hashlib.sha256(secret.translate(_IPAD))
    outer = hashlib.sha256(secret.translate(_OPAD))
    return inner.copy, outer.copy


def _hmac_hex(keyed: _Keyed, message: bytes) -> str:
    inner = keyed[0]()
    inner.update(message)
    outer = keyed[1]()
    outer.update(inner.digest())
    mac: str = outer.hexdigest()
    return mac


_PREFIX = "crashproof-record-v1"  # the MAC message format; a new format needs a new name


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
    """Every field behind its length, so no two different records share a message.
    (Lengths count characters of the one string that is then encoded: still
    unambiguous, and a single f-string is 5x cheaper than packing each field; this runs
    for every record written and every record read.)"""
    k = "-" if key is None else f"{len(key)}:{key}"
    v = "-" if value is None else f"{len(value)}:{value}"
    text = (
        f"{_PREFIX}|{len(run_id)}:{run_id}|{seq}|{type_}|{k}|"
        f"{len(payload)}:{payload}|{v}|{created_at!r}|{prev_mac}"
    )
    return text.encode("utf-8", "surrogatepass")


class Sealer:
    """Seals records with the keyring's current key; verifies with whichever key sealed."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        # Keyed HMAC states by key id, copied per record (_keyed_state).
        self._states: dict[str, _Keyed] = {}
        # What seal() uses for every record written: the current key's id and states.
        self._current_id = keyring.current_id
        self._current = self._state(keyring.current_id, keyring.current)

    def _state(self, kid: str, secret: bytes) -> _Keyed:
        state = self._states.get(kid)
        if state is None:
            state = self._states[kid] = _keyed_state(secret)
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
        """(key id, MAC hex) for a record about to be stored."""
        message = _message(run_id, seq, type_, key, payload, value, created_at, prev_mac)
        return self._current_id, _hmac_hex(self._current, message)

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
        if not key_id or not mac:
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
        a journal); any record that fails is re-checked by ``verify`` for its error."""
        states: dict[str | None, _Keyed] = {}
        compare = hmac.compare_digest
        # _message and _hmac_hex, inlined with the run's part of the message formatted
        # once: this loop runs for every record of every journal read
        # (tests/unit/test_seal_chain.py pins it to seal and verify).
        head = f"{_PREFIX}|{len(run_id)}:{run_id}|"
        for record in records:
            seq, type_, key, payload, value, created_at, key_id, mac = record[:8]
            keyed = states.get(key_id)
            if keyed is None:
                secret = self.keyring.get(key_id) if key_id and mac else None
                if secret is None:  # no MAC, or a key this keyring lacks: verify explains
                    self.verify(
                        run_id, seq, type_, key, payload, value, created_at, prev_mac, key_id, mac
                    )
                    raise JournalTampered(f"run {run_id!r} record {seq} cannot be verified")
                keyed = states[key_id] = self._state(str(key_id), secret)
            inner = keyed[0]()
            inner.update(
                f"{head}{seq}|{type_}|{'-' if key is None else f'{len(key)}:{key}'}|"
                f"{len(payload)}:{payload}|{'-' if value is None else f'{len(value)}:{value}'}|"
                f"{created_at!r}|{prev_mac}".encode("utf-8", "surrogatepass")
            )
            h = keyed[1]()
            h.update(inner.digest())
            if not compare(h.hexdigest(), mac or ""):
                self.verify(
                    run_id, seq, type_, key, payload, value, created_at, prev_mac, key_id, mac
                )
                raise JournalTampered(f"run {run_id!r} record {seq} does not match its MAC")
            prev_mac = mac
        return prev_mac
