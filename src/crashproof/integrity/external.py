"""Seals and a generation witness for state an integration keeps outside the journal.

An adapter that stores its own rows (a LangGraph checkpointer, say) needs what the
journal has: an HMAC over every stored row, verified before the row is parsed, under the
ledger's keyring; and a generation per object mirrored outside the store, so a restored
older copy is refused. ``SealedState`` gives both, so the adapter never touches the keys
or the witness internals. Its MACs are domain-separated from journal records (another
prefix, the namespace, length-prefixed fields): a row MAC can never pass for a record's.

Obtained from ``Ledger.sealed_state(namespace)``; the witness lives beside the ledger's
own (``runs.db.<namespace>.witness``, schema ``<schema>_<namespace>_witness``), so the
ledger's ``check`` never mistakes its entries for runs.
"""

from __future__ import annotations

import hashlib
import hmac

from crashproof.errors import JournalRolledBack, JournalTampered, UnknownKeyId, WitnessMissing
from crashproof.integrity.keys import Keyring
from crashproof.integrity.witness import Witness

__all__ = ["SealedState"]

_PREFIX = b"crashproof-sealed-v1\x00"


def _message(namespace: str, fields: tuple[str | None, ...]) -> bytes:
    parts = [_PREFIX, namespace.encode("utf-8", "surrogatepass"), b"\x00"]
    for field in fields:
        if field is None:
            parts.append(b"-1:")
            continue
        data = field.encode("utf-8", "surrogatepass")
        parts += [str(len(data)).encode(), b":", data]
    return b"".join(parts)


class SealedState:
    """HMAC seals (``key id:hex``) over text fields, and a witnessed generation per name.

    ``seal(*fields)`` / ``verify(seal, *fields, what=...)``: fields are ``str`` or None
    (distinct from ""). ``check_generation(name, generation)``: refuse a stored
    generation behind the witness (a rollback) or one the witness never saw.
    ``start`` / ``advance``: record generation 0 before a name's first commit, then raise
    it after each commit (a crash in between leaves the store one ahead: accepted)."""

    def __init__(self, namespace: str, keyring: Keyring, witness: Witness | None) -> None:
        self.namespace = namespace
        self._keyring = keyring
        self._witness = witness

    def seal(self, *fields: str | None) -> str:
        kid = self._keyring.current_id
        mac = hmac.new(self._keyring.current, _message(self.namespace, fields), hashlib.sha256)
        return f"{kid}:{mac.hexdigest()}"

    def verify(self, seal: object, *fields: str | None, what: str) -> None:
        """Raise JournalTampered (or UnknownKeyId) unless ``seal`` is the MAC of exactly
        ``fields``; ``what`` names the row in the message."""
        kid, _, mac = seal.partition(":") if isinstance(seal, str) else ("", "", "")
        if not kid or not mac:
            raise JournalTampered(f"{what} carries no seal: it was not written by crashproof")
        secret = self._keyring.get(kid)
        if secret is None:
            raise UnknownKeyId(
                f"{what} was sealed with key id {kid}, which this keyring does not hold "
                f"(it has {self._keyring.current_id}); wrong key? Nothing was read."
            )
        expected = hmac.new(secret, _message(self.namespace, fields), hashlib.sha256)
        if not hmac.compare_digest(expected.hexdigest(), mac):
            raise JournalTampered(
                f"{what} was altered after it was written (its seal does not match); "
                "nothing of it was read"
            )

    def witnessed(self, name: str) -> int | None:
        return None if self._witness is None else self._witness.get(name)

    def check_generation(self, name: str, generation: int | None) -> None:
        """``generation``: the one the store holds for ``name`` (None: no trace of it)."""
        if self._witness is None:
            return
        seen = self._witness.get(name)
        if seen is None:
            if generation:
                raise WitnessMissing(
                    f"{self.namespace} {name!r} is at generation {generation} but its "
                    "witness never saw it (another database, or the witness was lost); "
                    "nothing was read"
                )
            return
        if (generation or 0) < seen:
            raise JournalRolledBack(
                f"{self.namespace} {name!r} was rolled back: the witness saw generation "
                f"{seen}, the store holds {generation or 0}. An older copy of the database "
                "was restored; nothing was read."
            )

    def start(self, name: str) -> None:
        if self._witness is not None:
            self._witness.start(name)

    def advance(self, name: str, generation: int) -> None:
        if self._witness is not None:
            self._witness.advance(name, generation)

    def close(self) -> None:
        if self._witness is not None:
            self._witness.close()
