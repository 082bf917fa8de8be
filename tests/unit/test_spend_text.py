"""A live decision's payload text: the step text built by hand (runtime/context.py) with
the encoded model/usage/cost spliced in, byte for byte what the encoder writes for the
whole payload (its text is sealed as stored)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import crashproof as cp
from crashproof.journal.codec import decode, encode
from crashproof.journal.records import EventType

_models = st.none() | st.text() | st.text(alphabet=st.characters(max_codepoint=127))
_usages = st.none() | st.dictionaries(st.text(), st.integers(min_value=0, max_value=2**70))
_costs = (
    st.none()
    | st.integers(min_value=0, max_value=2**64)
    | st.floats(min_value=0, allow_nan=False, allow_infinity=False)
)


def _stored_decision(model: Any, usage: Any, cost: Any) -> Any:
    """The stored ``step_done`` of a live decision reporting this model/usage/cost."""
    with cp.Ledger("memory://") as ledger:

        @ledger.workflow("decides", version="1")
        def decides(ctx: cp.Context) -> Any:
            return ctx.decide("plan", lambda: cp.Decision("p", model=model, usage=usage, cost=cost))

        assert ledger.run(decides, run_id="r") == "p"
        events = ledger._store.load_events("r")  # type: ignore[attr-defined]
    (done,) = [e for e in events if e.type is EventType.STEP_DONE]
    return done


@settings(max_examples=60, deadline=None)
@given(model=_models, usage=_usages, cost=_costs)
def test_a_decisions_text_is_what_the_encoder_writes(
    model: str | None, usage: dict[str, int] | None, cost: float | None
) -> None:
    done = _stored_decision(model, usage, cost)
    assert done.payload_text == encode(decode(done.payload_text), what="the payload")
    spent = {k: done.payload[k] for k in ("model", "usage", "cost")}
    assert spent == {"model": model, "usage": usage, "cost": cost}


def test_unusual_values_are_stored_as_the_encoder_writes_them() -> None:
    class Tokens(int):
        pass

    for model, usage, cost in (
        ("lone \udc80", None, None),
        ("m", {"in": Tokens(3)}, None),
        ("m", {"é": 1}, -0.0),
    ):
        done = _stored_decision(model, usage, cost)
        assert done.payload_text == encode(done.payload, what="the payload")
