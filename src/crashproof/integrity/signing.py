"""Ed25519 signatures of the statements humans make about runs: approvals and review
decisions.

A statement is a JSON object; what is signed is its RFC 8785 canonical form (the same
canonical JSON as intent digests), so a statement re-encoded by any JSON library still
verifies, and any change of any field does not. Keys are PEM files: PKCS#8 for the
private key (written 0600, never stored in a ledger), SubjectPublicKeyInfo for the public
key that goes into the approvers registry. A key is named by its fingerprint: the SHA-256
of its 32 raw public bytes.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from crashproof.errors import KeyUnusable, SerializationError
from crashproof.journal.codec import sha256_hex

__all__ = [
    "generate_keypair",
    "key_fingerprint",
    "load_private_key",
    "load_public_key",
    "public_pem",
    "sign_statement",
    "statement_bytes",
    "verify_statement",
]


def statement_bytes(statement: dict[str, Any]) -> bytes:
    """The bytes that are signed: the RFC 8785 canonical JSON of ``statement``."""
    try:
        return rfc8785.dumps(statement)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise SerializationError(
            f"a signed statement must be plain JSON ({exc}); nothing was signed"
        ) from None


def generate_keypair(private_path: Path, public_path: Path | None = None) -> str:
    """Write a new Ed25519 private key (PEM, mode 0600, never overwritten) and its public
    key (PEM, default ``<private>.pub``); returns the key's fingerprint."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_path = public_path or private_path.with_name(private_path.name + ".pub")
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} already exists; keys are never overwritten")
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_text(public_pem(key.public_key()))
    return key_fingerprint(key.public_key())


def load_private_key(path: Path | str) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (KeyUnusable with the reason otherwise)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyUnusable(f"cannot read signing key {path}: {exc}; nothing was signed") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyUnusable(
            f"{path} is not an unencrypted PEM private key ({exc}); nothing was signed. "
            "Make one with: crashproof approvers keygen FILE"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyUnusable(
            f"{path} holds a {type(key).__name__}, not an Ed25519 key; nothing was signed"
        )
    return key


def load_public_key(pem: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM text (KeyUnusable with the reason otherwise)."""
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyUnusable(f"not a PEM public key ({exc}); nothing was changed") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyUnusable(
            f"the public key is a {type(key).__name__}, not Ed25519; nothing was changed"
        )
    return key


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def key_fingerprint(key: Ed25519PublicKey) -> str:
    """SHA-256 hex of the 32 raw public-key bytes."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_hex(raw)


def sign_statement(key: Ed25519PrivateKey, statement: dict[str, Any]) -> str:
    """The base64 Ed25519 signature of the statement's canonical bytes."""
    return base64.b64encode(key.sign(statement_bytes(statement))).decode("ascii")


def verify_statement(public: str | Ed25519PublicKey, statement: dict[str, Any], sig: str) -> bool:
    """Whether ``sig`` is a valid signature of ``statement`` by ``public`` (PEM or key)."""
    key = load_public_key(public) if isinstance(public, str) else public
    try:
        raw = base64.b64decode(sig, validate=True)
        key.verify(raw, statement_bytes(statement))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True
