"""The fast digest paths must give exactly the RFC 8785 bytes: digests are stored, and a
different byte would flag every in-flight run as non-deterministic."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from crashproof.errors import SerializationError
from crashproof.journal.codec import args_digest, canonical_digest, decode, encode

SAFE = 2**53 - 1
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE, max_value=SAFE)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
    # whole floats, which the fast path writes as ints, and the edges of that range
    | st.integers(min_value=-SAFE, max_value=SAFE).map(float)
    | st.sampled_from([0.0, -0.0, 1.0, float(SAFE), -float(SAFE), 2.0**53, 1e21, 0.5])
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


# Any code point, lone surrogates included (st.text() leaves them out): the fast path
# writes non-ASCII text as json does, which must be RFC 8785's bytes or its refusal.
any_text = st.text(st.characters(exclude_categories=()), max_size=12)
texts = st.recursive(
    any_text | st.integers(0, 9),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(st.characters(max_codepoint=127), max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(texts)
def test_canonical_digest_of_any_text_is_rfc8785_or_the_same_refusal(value: Any) -> None:
    try:
        expected = rfc(value)
    except rfc8785.CanonicalizationError:
        with pytest.raises(SerializationError, match="cannot be canonicalized"):
            canonical_digest(value, what="x")
        return
    assert canonical_digest(value, what="x") == expected


@given(json_values)
def test_encode_decode_round_trip(value: Any) -> None:
    assert decode(encode(value, what="x")) == value


class _Named:
    """What intent_digest reads of a tool: its name and version."""

    def __init__(self, name: Any, version: Any) -> None:
        self.name = name
        self.version = version


flat_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)  # beyond 2**53: the slow path
    | st.text(max_size=8)
    | st.text(alphabet=st.characters(max_codepoint=127), max_size=8)
)


@given(
    st.dictionaries(st.text(max_size=6), flat_scalars | json_values, max_size=5),
    st.text(max_size=6),
    st.text(max_size=4),
)
def test_intent_digest_equals_rfc8785(params: dict[str, Any], name: str, version: str) -> None:
    """The act intent's fast path (flat params, ASCII) and its fallback give the RFC 8785
    digest of {tool, tool_version, params}."""
    from crashproof.runtime.steps.act_records import intent_digest

    tool: Any = _Named(name, version)
    try:
        expected = rfc({"tool": name, "tool_version": version, "params": params})
    except (rfc8785.CanonicalizationError, ValueError, TypeError):
        return  # not canonicalizable (an int beyond 2**53): intent_digest refuses it too
    assert intent_digest(tool, params, "k") == expected


@given(
    st.dictionaries(st.text(max_size=6), flat_scalars | json_values, max_size=5),
    st.text(max_size=6),
    st.text(max_size=4),
)
def test_hold_digest_equals_rfc8785_without_the_version(
    params: dict[str, Any], name: str, version: str
) -> None:
    """What holds match: {tool, params}, the same for every version of the tool."""
    from crashproof.runtime.steps.act_records import hold_digest

    try:
        expected = rfc({"tool": name, "params": params})
    except (rfc8785.CanonicalizationError, ValueError, TypeError):
        return
    tool: Any = _Named(name, version)
    assert hold_digest(tool, params, "k") == expected
    bumped: Any = _Named(name, version + "1")
    assert hold_digest(bumped, params, "k") == expected


def test_intent_digest_fast_path_covers_the_usual_act() -> None:
    from crashproof.runtime.steps.act_records import _flat_intent

    tool: Any = _Named("http", "2")
    params = {"url": 'https://x/\\"\n\x1f\x7f', "n": -(2**53 - 1), "ok": True, "none": None}
    text = _flat_intent(tool, params)
    assert text is not None
    assert text.encode() == rfc8785.dumps({"tool": "http", "tool_version": "2", "params": params})
    assert _flat_intent(tool, {"nested": {"a": 1}}) is None
    assert _flat_intent(tool, {"f": 1.5}) is None
    assert _flat_intent(tool, {"s": "é"}) is None


def test_whole_floats_take_the_fast_path_with_rfc8785_bytes() -> None:
    value = {"usage": {"audio_seconds": 0.0, "tokens": 12, "ratio": -3.0}, "text": "é"}
    assert canonical_digest(value, what="a value") == rfc(value)
    assert canonical_digest([-0.0, 2.0**53], what="a value") == rfc([-0.0, 2.0**53])
