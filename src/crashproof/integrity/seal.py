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

_c_hmac_new: Callable[..., Any] | None
try:  # OpenSSL's HMAC object itself: copy/update/hexdigest without hmac.py's wrapper
    from _hashlib import hmac_new as _c_hmac_new
except ImportError:  # pragma: no cover - CPython built without OpenSSL
    _c_hmac_new = None


def _keyed_state(secret: bytes) -> Any:
    if _c_hmac_new is not None:
        return _c_hmac_new(secret, digestmod="sha256")
    return hmac.new(secret, digestmod=hashlib.sha256)  # pragma: no cover


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
        # Keyed HMAC states, copied per record: half the cost of hmac.digest().
        self._states: dict[str, Any] = {}
        # What seal() uses for every record written: the current key's id and state.
        self._current_id = keyring.current_id
        self._current_copy = self._state(keyring.current_id, keyring.current).copy

    def _state(self, kid: str, secret: bytes) -> Any:
        state = self._states.get(kid)
        if state is None:
            state = self._states[kid] = _keyed_state(secret)
        return state

    def _mac(self, kid: str, secret: bytes, message: bytes) -> str:
        h = self._state(kid, secret).copy()
        h.update(message)
        mac: str = h.hexdigest()
        return mac

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
        h = self._current_copy()
        h.update(_message(run_id, seq, type_, key, payload, value, created_at, prev_mac))
        return self._current_id, h.hexdigest()

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
        states: dict[str | None, Callable[[], Any]] = {}
        compare = hmac.compare_digest
        # _message, inlined with the run's part formatted once: this loop runs for every
        # record of every journal read (tests/unit/test_seal_chain.py pins the two equal).
        head = f"{_PREFIX}|{len(run_id)}:{run_id}|"
        for record in records:
            seq, type_, key, payload, value, created_at, key_id, mac = record[:8]
            copy = states.get(key_id)
            if copy is None:
                secret = self.keyring.get(key_id) if key_id and mac else None
                if secret is None:  # no MAC, or a key this keyring lacks: verify explains
                    self.verify(
                        run_id, seq, type_, key, payload, value, created_at, prev_mac, key_id, mac
                    )
                    raise JournalTampered(f"run {run_id!r} record {seq} cannot be verified")
                copy = states[key_id] = self._state(str(key_id), secret).copy
            h = copy()
            h.update(
                f"{head}{seq}|{type_}|{'-' if key is None else f'{len(key)}:{key}'}|"
                f"{len(payload)}:{payload}|{'-' if value is None else f'{len(value)}:{value}'}|"
                f"{created_at!r}|{prev_mac}".encode("utf-8", "surrogatepass")
            )
            if not compare(h.hexdigest(), mac or ""):
                self.verify(
                    run_id, seq, type_, key, payload, value, created_at, prev_mac, key_id, mac
                )
                raise JournalTampered(f"run {run_id!r} record {seq} does not match its MAC")
            prev_mac = mac
        return prev_mac
