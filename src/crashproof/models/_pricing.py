"""What a model call cost, from a price table the user passes: none is shipped, since
prices change and a stale table would under-count a budget silently."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Price", "Usage", "cost_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """Prices per million tokens. ``cached_input``: for input tokens read from the
    provider's prompt cache (defaults to ``input``); ``cache_write``: Anthropic's cache
    writes (defaults to ``input``)."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None

    def __post_init__(self) -> None:
        for field, value in (
            ("input", self.input),
            ("output", self.output),
            ("cached_input", self.cached_input),
            ("cache_write", self.cache_write),
        ):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"Price.{field} must be a finite number >= 0, not {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """One call's tokens, the same for every SDK. ``input`` counts every input token,
    cached ones included (Anthropic's separate cache counts are added in)."""

    input: int
    output: int
    cached: int = 0
    cache_write: int = 0

    def as_dict(self) -> dict[str, int]:
        """What the decision records (``total_tokens`` is what a token budget counts)."""
        out = {
            "input_tokens": self.input,
            "output_tokens": self.output,
            "cached_tokens": self.cached,
            "total_tokens": self.input + self.output,
        }
        if self.cache_write:
            out["cache_write_tokens"] = self.cache_write
        return out


def _price_for(prices: Mapping[str, Price], model: str) -> Price | None:
    """The exact model name, else the longest key it starts with (``gpt-4.1`` prices
    ``gpt-4.1-2025-04-14``, the dated name a response reports)."""
    if model in prices:
        return prices[model]
    best = max((k for k in prices if model.startswith(k)), key=len, default=None)
    return None if best is None else prices[best]


def cost_of(prices: Mapping[str, Price] | None, model: str | None, usage: Usage) -> float | None:
    """The call's cost in the table's currency, or None when the table has no price for
    the model (the tokens are recorded all the same)."""
    if not prices or model is None:
        return None
    price = _price_for(prices, model)
    if price is None:
        return None
    cached_price = price.input if price.cached_input is None else price.cached_input
    write_price = price.input if price.cache_write is None else price.cache_write
    fresh = max(0, usage.input - usage.cached - usage.cache_write)
    total = (
        fresh * price.input
        + usage.cached * cached_price
        + usage.cache_write * write_price
        + usage.output * price.output
    )
    return total / 1_000_000
