"""Small value types users pass to the runtime."""

from __future__ import annotations

import random as _random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crashproof.errors import PermanentError
from crashproof.journal.records import Limits

if TYPE_CHECKING:  # imported when checked: ``import crashproof`` does not load the guards
    from crashproof.runtime.guards.policy import Policy

__all__ = ["Decision", "RetryPolicy", "RunOptions", "StepOptions"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What a ``ctx.decide`` function may return to record model, usage and cost.

    ``usage`` maps token kinds to counts (e.g. ``{"input_tokens": 812,
    "output_tokens": 64}``); a run's token budget adds ``total_tokens`` when given,
    else the sum of all counts.
    """

    value: Any
    model: str | None = None
    usage: dict[str, int] | None = None
    cost: float | None = None
    # Telemetry of the call, live only (never journaled; a replay has none): attributes
    # under the OpenTelemetry GenAI semantic conventions (``gen_ai.provider.name``,
    # ``gen_ai.request.model``, ``gen_ai.response.id``, ...), handed to the ledger's call
    # scopes (``Ledger.on_call``). ``crashproof.models`` fills them in.
    attributes: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often a local step or decision is tried, and how long to wait between tries.

    Every failed attempt is journaled; a crash during the wait resumes the wait,
    not the count. A ``cp.Unavailable`` waits at least its ``retry_after``; when that is
    more than ``max_backoff``, or the attempts run out, the run stops resumable
    (``runtime/steps/outage.py``).
    """

    attempts: int = 3
    backoff: float = 0.5  # seconds before the 2nd attempt
    multiplier: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.0  # fraction of the delay added at random, 0..1
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.backoff < 0 or self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("RetryPolicy needs backoff >= 0, multiplier >= 1, 0 <= jitter <= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff, self.backoff * self.multiplier ** (attempt - 1))
        return base * (1 + self.jitter * _random.random())

    def retries(self, exc: BaseException) -> bool:
        """``exc`` is one of ``retry_on``, and not a ``cp.PermanentError`` (it says a
        try again fails too)."""
        return isinstance(exc, self.retry_on) and not isinstance(exc, PermanentError)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOptions:
    """Per-call options for ``ctx.step`` / ``ctx.decide`` (``options=`` is reserved)."""

    retry: RetryPolicy | None = field(default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """Per-run options for ``Ledger.run(..., options=cp.RunOptions(...))`` (the workflow
    parameter name ``options`` is reserved for it).

    ``limits``: a ``cp.Limits`` budget, enforced before each new step (see
    ``crashproof.runtime.guards.budget``). ``policy``: a ``cp.Policy`` every act must pass (see
    ``crashproof.runtime.guards.policy``). Both are recorded in the run's first record, so every
    resume enforces the same ones; they change only by journaled operator actions
    (``Ledger.resume(run_id, raise_budget=..., rebind_policy=..., by=...)``).
    """

    limits: Limits | None = None
    policy: Policy | None = None

    def __post_init__(self) -> None:
        if self.limits is not None and not isinstance(self.limits, Limits):
            raise TypeError(f"RunOptions.limits must be a cp.Limits, not {self.limits!r}")
        from crashproof.runtime.guards.policy import Policy

        if self.policy is not None and not isinstance(self.policy, Policy):
            raise TypeError(f"RunOptions.policy must be a cp.Policy, not {self.policy!r}")
