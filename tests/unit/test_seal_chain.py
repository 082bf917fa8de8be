"""Sealer.verify_chain (one loop over a whole journal) against Sealer.verify per record,
each test once with the native seal (where built) and once with the Python one."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from crashproof.errors import JournalTampered, UnknownKeyId
from crashproof.integrity.keys import Keyring
from crashproof.integrity.seal import V2, Sealer, _message, _message_v2
from crashproof.store.port import GENESIS

OLD, NEW = b"o" * 32, b"n" * 32


# Each test once with the native seal (where built) and once with the Python one.
pytestmark = pytest.mark.usefixtures("seal_implementation")


def _journal(sealer: Sealer, n: int = 6) -> list[list[Any]]:
    """Records as stored: (seq, type, key, payload, value, created_at, key_id, mac, blob)."""
    rows, prev = [], GENESIS
    for seq in range(n):
        key = None if seq == 0 else f"s#{seq}"
        value = None if seq == 3 else f'{{"i":{seq},"t":"\u00e9\\udcff"}}'
        payload = '{"kind":"step"}'
        kid, mac = sealer.seal("r", seq, "step_done", key, payload, value, 1.5 + seq, prev)
        rows.append([seq, "step_done", key, payload, value, 1.5 + seq, kid, mac, None])
        prev = mac
    return rows


def _per_record(sealer: Sealer, rows: list[list[Any]]) -> str:
    prev = GENESIS
    for seq, type_, key, payload, value, created_at, kid, mac, _ in rows:
        sealer.verify("r", seq, type_, key, payload, value, created_at, prev, kid, mac)
        prev = mac
    return prev


def test_a_sound_chain_verifies_like_record_by_record_across_a_key_rotation() -> None:
    rows = _journal(Sealer(Keyring(OLD)), 3)
    rotated = Sealer(Keyring(NEW, {Keyring(OLD).current_id: OLD}))
    prev = rows[-1][7]
    for seq in range(3, 6):  # the rest sealed with the new key, chained on
        kid, mac = rotated.seal("r", seq, "step_done", f"k{seq}", "{}", None, 9.0, prev)
        rows.append([seq, "step_done", f"k{seq}", "{}", None, 9.0, kid, mac, None])
        prev = mac
    assert rotated.verify_chain("r", rows, GENESIS) == _per_record(rotated, rows) == prev


@pytest.mark.parametrize(
    ("field", "change", "error"),
    [
        (3, lambda p: p.replace("step", "stop"), JournalTampered),  # payload edited
        (5, lambda t: t + 1e-9, JournalTampered),  # timestamp edited
        (7, lambda m: None, JournalTampered),  # MAC removed mid-chain
        (6, lambda k: "feedfacefeedface", UnknownKeyId),  # a key this keyring lacks
    ],
)
def test_a_broken_record_fails_the_chain_with_the_same_error(
    field: int, change: Any, error: type[Exception]
) -> None:
    sealer = Sealer(Keyring(OLD))
    rows = _journal(sealer)
    rows[4][field] = change(rows[4][field])
    with pytest.raises(error) as per_record:
        _per_record(sealer, rows)
    with pytest.raises(error) as chained:
        sealer.verify_chain("r", rows, GENESIS)
    assert str(chained.value) == str(per_record.value)
    assert "record 4" in str(chained.value)


def test_a_removed_record_breaks_the_chain() -> None:
    sealer = Sealer(Keyring(OLD))
    rows = _journal(sealer)
    del rows[2]
    with pytest.raises(JournalTampered, match="record 3 does not match its MAC"):
        sealer.verify_chain("r", rows, GENESIS)


@pytest.mark.parametrize("length", [16, 32, 63, 64, 65, 200])
def test_the_two_state_mac_is_the_standard_hmac_sha256_for_any_key_length(length: int) -> None:
    """Sealer computes HMAC-SHA256 from two keyed SHA-256 states (RFC 2104 spelled out);
    it must equal the standard HMAC for every key length, keys longer than a block too."""
    secret = bytes(range(length % 256)) * (length // 256) + bytes(range(length % 256))
    sealer = Sealer(Keyring(secret))
    fields = ("r", 4, "step_done", "s#4", '{"kind":"step"}', '"\u00e9"', 1.25, "ab" * 32)
    _kid, mac = sealer.seal(*fields)
    assert mac == V2 + hmac.new(secret, _message_v2(*fields), hashlib.sha256).hexdigest()
    row = [4, "step_done", "s#4", '{"kind":"step"}', '"\u00e9"', 1.25, _kid, mac, None]
    assert sealer.verify_chain("r", [row], "ab" * 32) == mac
    # A record sealed before v2 (a bare hex MAC over the v1 message) still verifies.
    v1 = hmac.new(secret, _message(*fields), hashlib.sha256).hexdigest()
    assert sealer.verify_chain("r", [[*row[:7], v1, None]], "ab" * 32) == v1
    sealer.verify(*fields[:7], "ab" * 32, _kid, v1)


def _v1_journal(secret: bytes, n: int) -> list[list[Any]]:
    """Records as a crashproof before MAC v2 sealed them (bare hex over the v1 message)."""
    rows, prev = [], GENESIS
    kid = Keyring(secret).current_id
    for seq in range(n):
        fields = ("r", seq, "step_done", f"s#{seq}", '{"kind":"step"}', f"{seq}", 2.5 + seq)
        mac = hmac.new(secret, _message(*fields, prev), hashlib.sha256).hexdigest()
        rows.append([*fields[1:], kid, mac, None])
        prev = mac
    return rows


def test_a_v1_journal_continued_in_v2_verifies_and_neither_format_passes_for_the_other() -> None:
    sealer = Sealer(Keyring(OLD))
    rows = _v1_journal(OLD, 3)
    prev = rows[-1][7]
    for seq in range(3, 6):  # resumed by this crashproof: new records are v2, chained on
        kid, mac = sealer.seal("r", seq, "step_done", None, "{}", None, 9.0 + seq, prev)
        assert mac.startswith(V2)
        assert not rows[2][7].startswith(V2)
        rows.append([seq, "step_done", None, "{}", None, 9.0 + seq, kid, mac, None])
        prev = mac
    assert sealer.verify_chain("r", rows, GENESIS) == _per_record(sealer, rows) == prev
    built = sealer.verify_rows("r", [row[:8] for row in rows], lambda *fields: fields)
    assert built == [("r", *row[:4], row[5], row[4]) for row in rows]
    for index, relabel in ((1, lambda m: V2 + m), (4, lambda m: m[len(V2) :])):
        forged = [list(row) for row in rows]
        forged[index][7] = relabel(forged[index][7])
        with pytest.raises(JournalTampered, match=f"record {index} does not match"):
            sealer.verify_chain("r", forged, GENESIS)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((None, "x"), ("None", "x")),  # a missing key is not the key "None"
        (("k", None), ("k", "None")),  # nor a missing value the value "None"
        (("k|1", "2"), ("k", "1|2")),  # lengths keep field boundaries apart
    ],
)
def test_the_v2_message_tells_apart_records_that_differ(
    a: tuple[str | None, str | None], b: tuple[str | None, str | None]
) -> None:
    def message(key: str | None, value: str | None) -> bytes:
        return _message_v2("r", 1, "step_done", key, "{}", value, 1.0, GENESIS)

    assert message(*a) != message(*b)


def test_unusual_but_sound_v2_records_verify_in_the_chain() -> None:
    """A lone surrogate (a checkpoint's escape) and an int timestamp (a store that keeps
    what it was given) take verify()'s path inside the chain and still verify."""
    sealer = Sealer(Keyring(OLD))
    kid, first = sealer.seal("r", 0, "run_started", None, "{}", '"\udcff"', 3, GENESIS)
    kid, second = sealer.seal("r", 1, "step_done", "s\udcff", "{}", None, 4.0, first)
    rows = [
        [0, "run_started", None, "{}", '"\udcff"', 3, kid, first],
        [1, "step_done", "s\udcff", "{}", None, 4.0, kid, second],
    ]
    assert sealer.verify_chain("r", rows, GENESIS) == second
    rows[0][5] = 3.0  # stored as a REAL: the same instant
    assert sealer.verify_chain("r", rows, GENESIS) == second
    rows[0][5] = "3.0"  # not a number
    with pytest.raises(JournalTampered, match="record 0 does not match"):
        sealer.verify_chain("r", rows, GENESIS)


def test_records_of_runs_sealed_in_turn_each_carry_their_own_runs_mac() -> None:
    """seal() keeps the message's run part for the run sealed last: runs sealed in turn
    (concurrent runs on one store) must still each get the standard HMAC of their own
    v2 message."""
    sealer = Sealer(Keyring(OLD))
    for run_id in ("a", "bb", "a", "a", "c" * 40, "bb"):
        fields = (run_id, 7, "step_done", "s#7", '{"kind":"step"}', "1", 2.5, "ab" * 32)
        _kid, mac = sealer.seal(*fields)
        assert mac == V2 + hmac.new(OLD, _message_v2(*fields), hashlib.sha256).hexdigest()


@pytest.mark.parametrize("length", [16, 65])
@pytest.mark.parametrize("size", [0, 400, 500, 600, 5000])
def test_small_and_large_records_carry_the_standard_hmac(length: int, size: int) -> None:
    """Records of any size (the native seal builds messages over 1 KiB off its stack):
    the standard HMAC-SHA256 of the v2 message."""
    secret = bytes(range(length))
    sealer = Sealer(Keyring(secret))
    fields = ("r", 9, "step_done", "k", '{"kind":"step"}', "x" * size, 1.5, "cd" * 32)
    _kid, mac = sealer.seal(*fields)
    assert mac == V2 + hmac.new(secret, _message_v2(*fields), hashlib.sha256).hexdigest()
    row = [9, "step_done", "k", '{"kind":"step"}', "x" * size, 1.5, _kid, mac]
    assert sealer.verify_chain("r", [row], "cd" * 32) == mac
