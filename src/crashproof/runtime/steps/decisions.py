"""What a model's decision reports about itself (``cp.Decision``: model, usage, cost),
checked before anything of it is sealed into the journal: budgets add these up."""

from __future__ import annotations

import math

from crashproof.errors import SerializationError
from crashproof.runtime.options import Decision

__all__ = ["check_decision"]


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
