"""A live decision's model/usage/cost text, built directly (runtime/steps/decisions.py), must
be byte for byte what the encoder writes: its payload text is sealed as stored."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from crashproof.journal.codec import decode, encode
from crashproof.runtime.options import Decision
from crashproof.runtime.steps.decisions import check_decision, spend_text

_models = st.none() | st.text() | st.text(alphabet=st.characters(max_codepoint=127))
_usages = st.none() | st.dictionaries(st.text(), st.integers(min_value=0, max_value=2**70))
_costs = (
    st.none()
    | st.integers(min_value=0, max_value=2**64)
    | st.floats(min_value=0, allow_nan=False, allow_infinity=False)
)


@given(model=_models, usage=_usages, cost=_costs)
def test_the_built_spend_text_is_what_the_encoder_writes(
    model: str | None, usage: dict[str, int] | None, cost: float | None
) -> None:
    check_decision(Decision(None, model=model, usage=usage, cost=cost), "d")
    spent: dict[str, Any] = {"model": model, "usage": usage, "cost": cost}
    text = spend_text(spent, "d")
    assert text == encode(spent, what="spent")
    assert decode(text) == spent


def test_unusual_values_take_the_encoder() -> None:
    class Tokens(int):
        pass

    for spent in (
        {"model": "lone \udc80", "usage": None, "cost": None},
        {"model": "m", "usage": {"in": Tokens(3)}, "cost": None},
        {"model": "m", "usage": {"é": 1}, "cost": -0.0},
    ):
        assert spend_text(spent, "d") == encode(spent, what="spent")
