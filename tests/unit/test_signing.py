"""Ed25519 statements: canonical bytes, keys on disk, and what a signature refuses."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.integrity.signing import (
    generate_keypair,
    key_fingerprint,
    load_private_key,
    load_public_key,
    public_pem,
    sign_statement,
    statement_bytes,
    verify_statement,
)

STATEMENT = {"run_id": "r", "step": "s", "n": 1, "nested": {"b": 2, "a": [1, "é"]}}


def test_the_signed_bytes_are_rfc8785_whatever_the_key_order() -> None:
    reordered = {"nested": {"a": [1, "é"], "b": 2}, "n": 1, "step": "s", "run_id": "r"}
    assert statement_bytes(STATEMENT) == statement_bytes(reordered)
    assert statement_bytes(STATEMENT).startswith(b'{"n":1,"nested":{"a":[1,"')
    with pytest.raises(cp.SerializationError, match="nothing was signed"):
        statement_bytes({"x": float("nan")})


def test_keys_on_disk_round_trip_and_are_never_overwritten(tmp_path: Path) -> None:
    private = tmp_path / "k.pem"
    fingerprint = generate_keypair(private)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = load_private_key(private)
    public = (tmp_path / "k.pem.pub").read_text()
    assert public == public_pem(key.public_key())
    assert key_fingerprint(load_public_key(public)) == fingerprint
    with pytest.raises(FileExistsError, match="never overwritten"):
        generate_keypair(private)


def test_a_signature_verifies_only_the_statement_and_the_key_it_was_made_with(
    tmp_path: Path,
) -> None:
    generate_keypair(tmp_path / "a.pem")
    generate_keypair(tmp_path / "b.pem")
    a = load_private_key(tmp_path / "a.pem")
    b_public = (tmp_path / "b.pem.pub").read_text()
    signature = sign_statement(a, STATEMENT)
    assert verify_statement(public_pem(a.public_key()), STATEMENT, signature)
    assert not verify_statement(b_public, STATEMENT, signature)
    assert not verify_statement(a.public_key(), {**STATEMENT, "n": 2}, signature)
    assert not verify_statement(a.public_key(), STATEMENT, signature[:-4] + "AAA=")
    assert not verify_statement(a.public_key(), STATEMENT, "not base64!")


def test_unusable_keys_are_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(cp.KeyUnusable, match="not an unencrypted PEM private key"):
        load_private_key(tmp_path / "junk.pem")
    with pytest.raises(cp.KeyUnusable, match="cannot read signing key"):
        load_private_key(tmp_path / "missing.pem")
    with pytest.raises(cp.KeyUnusable, match="not a PEM public key"):
        load_public_key("junk")
