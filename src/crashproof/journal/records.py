"""Journal records and the read models folded from them. Pure data, no I/O.

A run's journal is an append-only sequence of events numbered 0, 1, 2, ...;
everything else (a run's status, its steps, its budget) is folded from it.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from crashproof.errors import IntegrityError
from crashproof.journal.codec import decode, encode

__all__ = [
    "BUDGET_KINDS",
    "Budget",
    "EVENT_TYPES",
    "Event",
    "EventType",
    "KeptRequest",
    "request_sha256",
    "with_request",
    "Limits",
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
    MOVED = "moved"  # exported as a move: it continues where the checkpoint is imported

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)

    @property
    def frozen(self) -> bool:
        return self in (RunStatus.NEEDS_REVIEW, RunStatus.AWAITING_APPROVAL)


class StepStatus(enum.StrEnum):
    """A step's state as its journal records show it. There is no "planned": nothing of
    a step is journaled before it starts (an act's first record is its intent,
    ``running``), because a resume reaches the same step again by replaying the code up
    to it; a record per planned step would cost a commit and recover nothing. A plan
    the run must keep is a step's result (``succeeded``), and an act waiting for an
    approval is the pending act of its ``awaiting_approval`` freeze."""

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
    CHECK = "check"  # a verification and the environments it saw (runtime/steps/checks.py)


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
    RUN_STOPPED = "run_stopped"  # stopped cleanly, resumable (a budget, a service out)
    BUDGET_RAISED = "budget_raised"  # an operator raised the run's limits (who, old, new)
    POLICY_REBOUND = "policy_rebound"  # an operator re-bound the run to another policy
    APPROVER_ADDED = "approver_added"  # the approvers registry trusts a new public key
    APPROVAL_GRANTED = "approval_granted"  # a signed approval of a pending act
    APPROVAL_REJECTED = "approval_rejected"  # a signed refusal of a pending act, with a reason
    APPROVAL_CONSUMED = "approval_consumed"  # its nonce used, just before the act's intent
    REVIEW_DECIDED = "review_decided"  # a signed replan/abort decision on a review case
    REVIEW_CONSUMED = "review_consumed"  # its nonce used, the receipt re-read unchanged
    RUN_MOVED = (
        "run_moved"  # exported as a move: this journal ends here (runtime/operations/moving.py)
    )
    RUN_IMPORTED = "run_imported"  # installed from a checkpoint (who, which, move or copy)
    # Before a resume under changed code or schema: may the run go on (runtime/replayer/verdict.py)
    COMPATIBILITY_VERDICT = "compatibility_verdict"
    # An operator lets this run's act go on although other runs hold its intent unresolved
    INTENT_OVERRIDE = "intent_override"
    # An operator re-drives a failed run under its own id (runtime/driving/retrying.py)
    RUN_RETRIED = "run_retried"
    # A reconciliation's finding on one act (runtime/operations/reconciling.py): no status
    ACT_RECONCILED = "act_reconciled"
    # An operator stopped the run for good (runtime/operations/cancelling.py)
    RUN_CANCELLED = "run_cancelled"
    # This run was forked from another's prefix (runtime/operations/forking.py)
    RUN_FORKED = "run_forked"


# Each EventType by its stored text: EventType(x) costs ~1 us per record read.
EVENT_TYPES = {t.value: t for t in EventType}


class Event:
    """One journal record (build it with keywords; treat it as immutable).

    ``payload`` holds the small, structured facts; ``value_json`` holds the
    (possibly large) recorded value as JSON text — a step's result, a model's
    response, a run's result. Stores keep large values once, content-addressed.

    A record read back from a store (:meth:`stored`) keeps its payload as the stored
    JSON text, ``payload_json``, and decodes it on first use: replaying a recorded call
    only needs its kind, digest and status, which the context reads from the start of
    the text (``Context._call``), and decoding every payload was a fifth of a resume's
    time. A slotted class
    rather than a dataclass: replay builds one per recorded call.
    """

    __slots__ = (
        "_payload",
        "created_at",
        "key",
        "payload_json",
        "run_id",
        "seq",
        "type",
        "value_json",
    )

    # A live decision's request for people to read (runtime/operations/requests.py), kept
    # beside the record, not in it: the record holds its SHA-256 only, so a resume never
    # reads it. Set on a KeptRequest only; every other record reads this None.
    request_text: str | None = None

    def __init__(
        self,
        run_id: str,
        seq: int,
        type: EventType,
        key: str | None,
        payload: dict[str, Any],
        created_at: float,
        value_json: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.seq = seq
        self.type = type
        self.key = key
        self._payload: dict[str, Any] | None = payload
        self.payload_json: str | None = None
        self.created_at = created_at
        self.value_json = value_json

    @classmethod
    def stored(
        cls,
        run_id: str,
        seq: int,
        type_: EventType,
        key: str | None,
        payload_json: str,
        created_at: float,
        value_json: str | None,
        payload: dict[str, Any] | None = None,
    ) -> Event:
        """A record whose payload's stored text is known: as a store returns it (its MAC
        already verified; ``payload`` None, decoded from the text when something reads
        it), or as the runtime builds it (``payload`` given, ``payload_json`` exactly
        ``codec.encode(payload)``; a store writes :attr:`payload_text`)."""
        event = cls.__new__(cls)
        event.run_id = run_id
        event.seq = seq
        event.type = type_
        event.key = key
        event._payload = payload
        event.payload_json = payload_json
        event.created_at = created_at
        event.value_json = value_json
        return event

    @classmethod
    def read(
        cls,
        run_id: str,
        seq: int,
        type_: str,
        key: str | None,
        payload_json: str,
        created_at: float,
        value_json: str | None,
    ) -> Event:
        """:meth:`stored`, for a record as a store reads it back, its MAC verified:
        ``type_`` is the stored text (KeyError when no EventType has it)."""
        event = cls.__new__(cls)
        event.run_id = run_id
        event.seq = seq
        event.type = EVENT_TYPES[type_]
        event.key = key
        event._payload = None
        event.payload_json = payload_json
        event.created_at = created_at
        event.value_json = value_json
        return event

    @property
    def payload_text(self) -> str:
        """The payload as stored: the text it was read as or built with, else its
        encoding (codec.encode, the one encoder of stored JSON)."""
        text = self.payload_json
        if text is None:
            text = encode(self.payload, what="a journal record")
        return text

    @property
    def payload(self) -> dict[str, Any]:
        payload = self._payload
        if payload is None:
            try:
                payload = decode(self.payload_json or "")
            except ValueError as exc:
                raise IntegrityError(
                    f"run {self.run_id!r} event {self.seq} is unreadable: {exc}"
                ) from None
            if not isinstance(payload, dict):
                raise IntegrityError(
                    f"run {self.run_id!r} event {self.seq} is unreadable: its payload is "
                    f"not a JSON object"
                )
            self._payload = payload
        return payload

    def mentions(self, name: str) -> bool:
        """Whether the payload has the top-level field ``name``; a stored payload whose
        text holds no ``"name"`` at all is not decoded to say no."""
        text = self.payload_json
        if self._payload is None and text is not None and f'"{name}"' not in text:
            return False
        return name in self.payload

    @property
    def value(self) -> Any:
        return None if self.value_json is None else decode(self.value_json)

    def _replace(self, **changes: Any) -> Event:
        """A copy with ``changes`` (the NamedTuple spelling it had before)."""
        fields: dict[str, Any] = dict(
            run_id=self.run_id,
            seq=self.seq,
            type=self.type,
            key=self.key,
            payload=self.payload,
            created_at=self.created_at,
            value_json=self.value_json,
        )
        fields.update(changes)
        return Event(**fields)

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.run_id,
            self.seq,
            self.type,
            self.key,
            self.payload,
            self.created_at,
            self.value_json,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # its payload is a dict

    def __repr__(self) -> str:
        return (
            f"Event(run_id={self.run_id!r}, seq={self.seq!r}, type={self.type!r}, "
            f"key={self.key!r}, payload={self.payload!r}, created_at={self.created_at!r}, "
            f"value_json={self.value_json!r})"
        )


class KeptRequest(Event):
    """A record to be appended with its decision's request text (``request_text``),
    which a store writes beside it, in the same transaction (``Store.load_requests``)."""

    __slots__ = ("request_text",)  # shadows the class attribute: a slot of its own


def with_request(event: Event, request: str | None) -> Event:
    """``event``, to be appended with the request text ``request`` (None: as it is)."""
    if request is None:
        return event
    kept: KeptRequest = KeptRequest.stored(  # type: ignore[assignment]  # cls.__new__(cls)
        event.run_id,
        event.seq,
        event.type,
        event.key,
        event.payload_text,
        event.created_at,
        event.value_json,
        event._payload,
    )
    kept.request_text = request
    return kept


def request_sha256(request: str) -> str:
    """The digest a decision's record holds of its request kept beside it: of its UTF-8
    (a text with a lone surrogate, which has none and which the runtime never builds, is
    hashed with the surrogate's own three bytes, as a record's seal does)."""
    try:
        data = request.encode()
    except UnicodeEncodeError:
        data = request.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


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


# The budget kinds, in the order they are checked; a stop's reason is "budget:<kind>".
BUDGET_KINDS = ("steps", "decisions", "tokens", "cost", "wall_time")
_LIMIT_FIELDS = {
    "steps": "max_steps",
    "decisions": "max_decisions",
    "tokens": "max_tokens",
    "cost": "max_cost",
    "wall_time": "max_wall_seconds",
}
_INTEGRAL = ("steps", "decisions", "tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What a run may consume; None is unlimited. Recorded in the run's first record, so
    every resume enforces the same limits; only a journaled raise changes them.

    ``max_steps`` counts step, decide and act calls (not now/random/uuid); ``max_tokens``
    and ``max_cost`` add up what decisions report (``cp.Decision(usage=, cost=)``);
    ``max_wall_seconds`` is wall-clock time since the run first started, *including* time
    the process was down or the run was stopped. Limits are checked before each new
    call starts: steps and wall time gate every step, decision and act; decisions,
    tokens and cost gate decisions only. The decision that crosses a token or cost limit
    completes and counts (its usage is known only then); the run stops before the next.
    """

    max_steps: int | None = None
    max_decisions: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    max_wall_seconds: float | None = None

    def __post_init__(self) -> None:
        for kind in BUDGET_KINDS:
            value = self.get(kind)
            if value is None:
                continue
            integral = kind in _INTEGRAL
            if (
                isinstance(value, bool)
                or not isinstance(value, int if integral else (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                need = "a non-negative integer" if integral else "a non-negative number"
                raise ValueError(f"Limits.{_LIMIT_FIELDS[kind]} must be {need} or None")

    def get(self, kind: str) -> int | float | None:
        """The limit of one budget kind (``"tokens"``, ...), None when unlimited."""
        value: int | float | None = getattr(self, _LIMIT_FIELDS[kind])
        return value

    def with_limits(self, changes: dict[str, int | float | None]) -> Limits:
        """A copy with the limits of some kinds replaced."""
        unknown = set(changes) - set(BUDGET_KINDS)
        if unknown:
            raise ValueError(
                f"unknown budget kind(s) {sorted(unknown)}; use {', '.join(BUDGET_KINDS)}"
            )
        fields: dict[str, Any] = {_LIMIT_FIELDS[kind]: self.get(kind) for kind in BUDGET_KINDS}
        fields.update({_LIMIT_FIELDS[kind]: value for kind, value in changes.items()})
        return Limits(**fields)

    def to_json(self) -> dict[str, int | float | None]:
        return {kind: self.get(kind) for kind in BUDGET_KINDS}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Limits:
        return cls().with_limits(dict(data or {}))

    @property
    def active(self) -> bool:
        """True when at least one limit is set."""
        return any(self.get(kind) is not None for kind in BUDGET_KINDS)


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
    failure: str | None = None  # failed steps: "permanent", "retryable", "policy", ...

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
    # Outcomes nobody could tell: act_unknown records plus lookups that failed or timed
    # out (kept in a freeze's or stop's evidence). Shown as budget.unknowns.
    unknowns: int = 0
    # Per act, the latest reconciliation finding journaled (``crashproof reconcile --record``).
    reconciled: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: tuple[StepInfo, ...] = ()
    limits: Limits | None = None  # None: the run has no limits
    policy: dict[str, Any] | None = None  # the bound policy: version, digest, identity
    # Signed approvals and review decisions journaled into the run, with their state.
    humans: tuple[dict[str, Any], ...] = ()

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
                "unknowns": self.unknowns,
            },
            "limits": None if self.limits is None else self.limits.to_json(),
            "policy": self.policy,
            "humans": list(self.humans),
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
                    "failure": s.failure,
                }
                for s in self.steps
            ],
            # Only once something was reconciled: the latest finding per act, and the drift.
            **({"reconciled": self.reconciled, "drifted": self.drifted} if self.reconciled else {}),
        }

    @property
    def drifted(self) -> list[str]:
        """The acts whose latest journaled reconciliation found them ``drifted``."""
        return [key for key, f in self.reconciled.items() if f.get("finding") == "drifted"]
