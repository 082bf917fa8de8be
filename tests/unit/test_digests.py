"""The fast digest paths must give exactly the RFC 8785 bytes: digests are stored, and a
different byte would flag every in-flight run as non-deterministic."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from crashproof.journal.codec import args_digest, canonical_digest, decode, encode

SAFE = 2**53 - 1
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE, max_value=SAFE)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def rfc(value: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


@given(st.lists(scalars, max_size=6))
def test_args_digest_equals_rfc8785_for_positional_args(args: list[Any]) -> None:
    assert args_digest(tuple(args), {}, what="x") == rfc({"args": args, "kwargs": {}})


@given(st.lists(json_values, max_size=3), st.dictionaries(st.text(), json_values, max_size=3))
def test_args_digest_equals_rfc8785_for_any_args(args: list[Any], kwargs: dict[str, Any]):
    assert args_digest(tuple(args), kwargs, what="x") == rfc({"args": args, "kwargs": kwargs})


@given(json_values)
def test_canonical_digest_equals_rfc8785(value: Any) -> None:
    assert canonical_digest(value, what="x") == rfc(value)


@given(json_values)
def test_encode_decode_round_trip(value: Any) -> None:
    assert decode(encode(value, what="x")) == value
