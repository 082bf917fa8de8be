"""The native seal (integrity/_seal.c) against the Python one and the standard library.

Both must give every record the same MAC: the standard HMAC-SHA256 of its v2 message
(seal._message_v2). Fields the native code does not take (another type, a lone
surrogate, a number out of its range) leave the decision to the Python path, so the
result is the same either way.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crashproof.integrity import seal
from crashproof.integrity.keys import Keyring
from crashproof.integrity.seal import V2, Sealer, _message_v2
from crashproof.store.port import GENESIS

native_only = pytest.mark.skipif(not seal.NATIVE, reason="the native seal is not built here")


def _standard(secret: bytes, fields: tuple[Any, ...]) -> str:
    return V2 + hmac.new(secret, _message_v2(*fields), hashlib.sha256).hexdigest()


def test_ci_builds_the_native_seal() -> None:
    """.ci/run sets CRASHPROOF_REQUIRE_NATIVE: there the fallback must not hide a build
    that failed (the benchmark and the suite would measure the Python seal unawares)."""
    if not os.environ.get("CRASHPROOF_REQUIRE_NATIVE"):
        pytest.skip("CRASHPROOF_REQUIRE_NATIVE not set")
    assert seal.NATIVE
    assert Sealer(Keyring(b"k" * 32)).native


def test_native_false_seals_in_python() -> None:
    sealer = Sealer(Keyring(b"k" * 32), native=False)
    assert not sealer.native
    assert sealer._current.native is None


def test_the_keyed_states_never_show_in_a_repr() -> None:
    sealer = Sealer(Keyring(b"\x01" * 32))
    assert repr(sealer._current) == "<keyed HMAC-SHA256 states>"


# Text of any code point, and some with a lone surrogate (a checkpoint's escape).
texts = st.text(max_size=80) | st.sampled_from(["\udcff", "a\ud800b", "\u00e9\udfff"])
stamps = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            0.0,
            -0.0,
            5e-324,
            -5e-324,
            2.2250738585072014e-308,
            2.225073858507201e-308,
            1.7976931348623157e308,
            1796150939.5595887,
            1.0,
            0.5,
            3.0,
        ]
    ),
    st.integers(min_value=-(2**60), max_value=2**60),  # a store that kept an int
)
records = st.tuples(
    texts,  # run id
    st.one_of(st.integers(min_value=0, max_value=2**40), st.integers(), st.booleans()),
    st.sampled_from(["step_done", "run_started", "act_intent", "decision"]) | texts,
    st.none() | texts,  # key
    texts | st.text(min_size=900, max_size=1500),  # payload; long ones leave the stack
    st.none() | texts,  # value
    stamps,
    st.sampled_from([GENESIS, "v2:" + "ab" * 32, "0" * 64]) | texts,  # previous MAC
)


@native_only
@settings(max_examples=400, deadline=None)
@given(fields=records, secret=st.binary(min_size=16, max_size=130))
def test_native_and_python_seals_give_the_standard_hmac_of_any_record(
    fields: tuple[Any, ...], secret: bytes
) -> None:
    native, python = Sealer(Keyring(secret)), Sealer(Keyring(secret), native=False)
    assert native.native
    expected = _standard(secret, fields)
    assert native.seal(*fields) == python.seal(*fields) == (native.keyring.current_id, expected)
    seq, type_, key, payload, value, created_at = fields[1:7]
    row = [seq, type_, key, payload, value, created_at, native.keyring.current_id, expected]
    for sealer in (native, python):  # the chain loop verifies it either way
        assert sealer.verify_chain(fields[0], [row], fields[7]) == expected


@native_only
@pytest.mark.parametrize(
    "stamp",
    [
        0.0,
        -0.0,
        math.inf,
        -math.inf,
        math.nan,
        5e-324,
        -5e-324,
        1e-310,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        -1.5,
        1796150939.5595887,
        2.0**30,
        2.0**31 - 2.0**-22,
        1.0 / 3.0,
    ],
)
def test_native_timestamps_are_written_as_float_hex(stamp: float) -> None:
    """The native message writes a timestamp as CPython's float.hex does (13 hex digits,
    subnormals, signed zero, repr for nan and the infinities)."""
    secret = b"s" * 32
    fields = ("r", 1, "step_done", "s", "{}", None, stamp, GENESIS)
    assert Sealer(Keyring(secret)).seal(*fields)[1] == _standard(secret, fields)


@native_only
def test_the_native_module_refuses_what_it_does_not_take() -> None:
    """TypeError (or UnicodeEncodeError) means "not mine": seal.py's Python path then
    decides. A state of the wrong size is refused before anything is read from it."""
    native = seal._native
    assert native is not None
    state = native.keyed_state(b"k" * 32)
    fields: list[Any] = ["r", 1, "step_done", "s", "{}", None, 1.0, GENESIS]
    assert native.mac_v2(state, *fields).startswith(V2)
    with pytest.raises(TypeError):
        native.mac_v2(state[:-1], *fields)
    with pytest.raises(TypeError):
        native.mac_v2(state, *fields[:-1])
    for index, odd in ((1, True), (1, 2**64), (1, 1.0), (6, 1), (2, b"x"), (4, 3), (7, None)):
        changed = list(fields)
        changed[index] = odd
        with pytest.raises(TypeError):
            native.mac_v2(state, *changed)
    changed = list(fields)
    changed[3] = "s\udcff"
    with pytest.raises(UnicodeEncodeError):
        native.mac_v2(state, *changed)
