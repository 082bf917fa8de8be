"""Journal records and the read models folded from them. Pure data, no I/O.

A run's journal is an append-only sequence of events numbered 0, 1, 2, ...;
everything else (a run's status, its steps, its budget) is folded from it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from crashproof.journal.codec import decode

__all__ = [
    "Budget",
    "Event",
    "EventType",
    "RunInfo",
    "RunRow",
    "RunStatus",
    "StepInfo",
    "StepKind",
    "StepStatus",
]


class RunStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    AWAITING_APPROVAL = "awaiting_approval"
    NEEDS_REVIEW = "needs_review"
    STOPPED = "stopped"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)

    @property
    def frozen(self) -> bool:
        return self in (RunStatus.NEEDS_REVIEW, RunStatus.AWAITING_APPROVAL)


class StepStatus(enum.StrEnum):
    PLANNED = "planned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    NEEDS_REVIEW = "needs_review"


class StepKind(enum.StrEnum):
    STEP = "step"
    DECIDE = "decide"
    ACT = "act"
    NOW = "now"
    RANDOM = "random"
    UUID = "uuid"
    PATCHED = "patched"


class EventType(enum.StrEnum):
    RUN_STARTED = "run_started"
    STEP_DONE = "step_done"  # a step's final outcome: value or recorded error
    ATTEMPT_FAILED = "attempt_failed"  # one failed attempt that will be retried
    RUN_SUCCEEDED = "run_succeeded"
    RUN_FAILED = "run_failed"
    RUN_FROZEN = "run_frozen"
    RUN_THAWED = "run_thawed"  # a resume lifts a retryable freeze (e.g. lookup unavailable)
    ACT_INTENT = "act_intent"  # committed before a tool executes (one per attempt)
    ACT_UNKNOWN = "act_unknown"  # the tool's outcome is unknown: reconcile before retrying
    OUTBOX_DELIVERED = "outbox_delivered"  # an outbox message reached its target
    OUTBOX_FAILED = "outbox_failed"  # a delivery attempt failed; the message stays pending


class Event(NamedTuple):
    """One journal record (immutable; build it with keywords).

    ``payload`` holds the small, structured facts; ``value_json`` holds the
    (possibly large) recorded value as JSON text — a step's result, a model's
    response, a run's result. Stores keep large values once, content-addressed.
    A NamedTuple rather than a frozen dataclass: replay builds one per recorded
    call, and a frozen dataclass costs five times as much to construct.
    """

    run_id: str
    seq: int
    type: EventType
    key: str | None
    payload: dict[str, Any]
    created_at: float
    value_json: str | None = None

    @property
    def value(self) -> Any:
        return None if self.value_json is None else decode(self.value_json)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    """The run index: a cache over the journal, rebuilt from events, never trusted over them."""

    run_id: str
    workflow: str
    version: str
    status: RunStatus
    input_digest: str
    created_at: float
    updated_at: float
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """What a run has consumed so far."""

    steps: int = 0
    decisions: int = 0
    tokens: int = 0
    cost: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepInfo:
    key: str
    kind: StepKind
    status: StepStatus
    attempts: int
    operation_id: str | None = None
    intent_digest: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: dict[str, Any] | None = None
    model: str | None = None
    usage: dict[str, int] | None = None
    cost: float | None = None
    delivery: str | None = None  # outbox acts: "pending" or "delivered"

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    run_id: str
    workflow: str
    version: str
    status: RunStatus
    input: dict[str, Any]
    input_digest: str
    created_at: float
    updated_at: float
    reason: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = None
    budget: Budget = field(default_factory=Budget)
    steps: tuple[StepInfo, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view for ``--json`` output and exports."""
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "version": self.version,
            "status": self.status.value,
            "reason": self.reason,
            "input": self.input,
            "input_digest": self.input_digest,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "result": self.result,
            "error": self.error,
            "evidence": self.evidence,
            "budget": {
                "steps": self.budget.steps,
                "decisions": self.budget.decisions,
                "tokens": self.budget.tokens,
                "cost": self.budget.cost,
            },
            "steps": [
                {
                    "key": s.key,
                    "kind": s.kind.value,
                    "status": s.status.value,
                    "attempts": s.attempts,
                    "operation_id": s.operation_id,
                    "intent_digest": s.intent_digest,
                    "started_at": s.started_at,
                    "ended_at": s.ended_at,
                    "duration": s.duration,
                    "error": s.error,
                    "model": s.model,
                    "usage": s.usage,
                    "cost": s.cost,
                    "delivery": s.delivery,
                }
                for s in self.steps
            ],
        }
