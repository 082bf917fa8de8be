"""The approvers registry: the trust root of signed approvals and review decisions.

Who may approve is itself journaled: every registration is an ``approver_added`` record
of a reserved system run (``crashproof:approvers``), so the registry is HMAC-sealed,
chained and witnessed like any run's journal, works on every store without a new store
method, moves with checkpoints, and fails closed when altered or rolled back (the ledger
refuses to read it). Registrations are attributable operator actions (who, host, time),
taken under the registry run's lease like any other append.

A registered name is bound to one Ed25519 public key for good: adding the same name with
the same key again changes nothing (a retried command is safe), with another key is
refused. Signatures are checked against the key registered *now*, by name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from crashproof.errors import CrashproofError
from crashproof.integrity.signing import key_fingerprint, load_public_key
from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType

__all__ = ["REGISTRY_RUN", "Approver", "added_event", "registry_of", "reserved"]

REGISTRY_RUN = "crashproof:approvers"
_RESERVED_PREFIX = "crashproof:"


def reserved(run_id: str) -> bool:
    """Run ids under ``crashproof:`` belong to the ledger itself (the registry)."""
    return run_id.startswith(_RESERVED_PREFIX)


@dataclass(frozen=True, slots=True, kw_only=True)
class Approver:
    """One registered approver (or reviewer): a name bound to an Ed25519 public key."""

    name: str
    public_key: str  # PEM (SubjectPublicKeyInfo)
    fingerprint: str  # SHA-256 of the raw public key
    added_by: str
    added_at: float
    host: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "added_by": self.added_by,
            "added_at": self.added_at,
            "host": self.host,
            "public_key": self.public_key,
        }


def registry_of(events: list[Event]) -> dict[str, Approver]:
    """The registry folded from the (verified) journal of the registry run."""
    out: dict[str, Approver] = {}
    for event in events:
        if event.type is not EventType.APPROVER_ADDED:
            continue
        p = payloads.approver_added(event)
        out[str(p["name"])] = Approver(
            name=str(p["name"]),
            public_key=str(p["public_key"]),
            fingerprint=str(p["fingerprint"]),
            added_by=str(p.get("by", "")),
            added_at=float(p.get("time", event.created_at)),
            host=str(p.get("host", "")),
        )
    return out


def added_event(
    registry: dict[str, Approver],
    name: str,
    public_key_pem: str,
    who: dict[str, Any],
    seq: int,
) -> Event | None:
    """The record that registers ``name``, None when it is already registered with this
    key; refuses a name bound to another key, or a malformed name or key."""
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise CrashproofError(
            f"approver name {name!r} is not usable: give a non-empty name without "
            "surrounding spaces; nothing was changed"
        )
    key = load_public_key(public_key_pem)
    fingerprint = key_fingerprint(key)
    known = registry.get(name)
    if known is not None:
        if known.fingerprint == fingerprint:
            return None
        raise CrashproofError(
            f"approver {name!r} is already registered with key {known.fingerprint[:16]}…, "
            f"not {fingerprint[:16]}…; nothing was changed. A name is bound to one key: "
            "register the new key under a new name"
        )
    return Event(
        run_id=REGISTRY_RUN,
        seq=seq,
        type=EventType.APPROVER_ADDED,
        key=name,
        payload={
            **who,
            "name": name,
            "public_key": public_key_pem.strip() + "\n",
            "fingerprint": fingerprint,
        },
        created_at=time.time(),
    )
