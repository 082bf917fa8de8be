"""What a model's decision reports about itself (``cp.Decision``: model, usage, cost),
checked before anything of it is sealed into the journal: budgets add these up."""

from __future__ import annotations

import math
from json.encoder import encode_basestring as _quoted
from typing import Any

from crashproof.errors import SerializationError
from crashproof.journal.codec import encode
from crashproof.runtime.options import Decision

__all__ = ["check_decision", "spend_text"]


def check_decision(decision: Decision, key: str) -> None:
    """Refuse model/usage/cost that budgets could not count, before anything is sealed."""
    usage, cost = decision.usage, decision.cost
    if usage is not None and not (
        isinstance(usage, dict)
        and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in usage.items()
        )
    ):
        raise SerializationError(
            f"decision {key!r}: usage must map token kinds to non-negative ints, not "
            f"{usage!r}; nothing was recorded"
        )
    if cost is not None and (
        isinstance(cost, bool)
        or not isinstance(cost, int | float)
        or not math.isfinite(cost)
        or cost < 0
    ):
        raise SerializationError(
            f"decision {key!r}: cost must be a finite number >= 0, not {cost!r}; nothing "
            "was recorded"
        )
    if decision.model is not None and not isinstance(decision.model, str):
        raise SerializationError(
            f"decision {key!r}: model must be a string, not {decision.model!r}"
        )


def spend_text(spent: dict[str, Any], key: str) -> str:
    """``codec.encode(spent)`` of a checked decision's ``{"model", "usage", "cost"}``,
    byte for byte: built directly for the usual values (ASCII text, exact ints, a finite
    float, None), else by the encoder. Every live decision writes it."""
    model, usage, cost = spent["model"], spent["usage"], spent["cost"]
    if model is None:
        model_text = "null"
    elif type(model) is str and model.isascii():
        model_text = _quoted(model)
    else:
        return _encoded(spent, key)
    if usage is None:
        usage_text = "null"
    elif type(usage) is dict:
        items = []
        for name, count in usage.items():
            if type(name) is not str or not name.isascii() or type(count) is not int:
                return _encoded(spent, key)
            items.append(f"{_quoted(name)}:{count}")
        usage_text = "{" + ",".join(items) + "}"
    else:
        return _encoded(spent, key)
    if cost is None:
        cost_text = "null"
    elif type(cost) is float or type(cost) is int:  # finite (check_decision)
        cost_text = repr(cost)
    else:
        return _encoded(spent, key)
    return f'{{"model":{model_text},"usage":{usage_text},"cost":{cost_text}}}'


def _encoded(spent: dict[str, Any], key: str) -> str:
    return encode(spent, what="model/usage/cost of decision", key=key)
