"""The shape of every journal record's payload, declared once, and typed views to read them.

What each record means is documented where it is written (the module named on its
class); this module is the one place its shape is declared: one ``TypedDict`` per
:class:`EventType`, its keys in the order their main writer puts them. The stored bytes
follow each writer's own order; nothing here builds, copies or checks a payload.

A key that a writer leaves out in some cases, or that older journals lack, is
``NotRequired``; its comment says when it is there. Such a key is read with ``.get``
unless the record's other fields say it is there (a failed step_done has its error):
a journal written before the key existed replays through the same code (tests/golden
holds journals of earlier formats).

Reading: ``payloads.step_done(event)["digest"]`` is ``event.payload["digest"]``, typed —
the same dict, no copy, no check (the caller knows the record's type). Where a function
is handed a record whose type it does not test, :func:`expect` checks it first. mypy
checks the key of every ``[...]`` read and write, not of a ``.get`` (PEP 589).

Writing: build the TypedDict (``payloads.RunThawed(status="running")``, or an annotated
literal) and hand it to ``Event`` / ``Context.append_event`` through :func:`as_dict`.
"""

# No ``from __future__ import annotations`` here: a TypedDict learns which keys are
# NotRequired from its evaluated annotations (Python 3.11), so with string annotations
# its __required_keys__ would name every key.
from collections.abc import Callable
from typing import Any, NotRequired, Required, TypedDict, TypeVar, cast

from crashproof.journal.operator_payloads import (
    ApprovalGranted,
    ApprovalRejected,
    ApproverAdded,
    BudgetRaised,
    IntentOverride,
    LimitsRecord,
    PolicyRebound,
    PolicyRecord,
    ReviewDecided,
    RunImported,
    RunMoved,
)
from crashproof.journal.records import Event, EventType

__all__ = [
    "ActIntent",
    "ActUnknown",
    "ApprovalConsumed",
    "ApprovalGranted",
    "ApprovalRejected",
    "ApproverAdded",
    "AttemptFailed",
    "BudgetRaised",
    "CompatibilityVerdict",
    "Consumption",
    "DriveRecord",
    "FrozenOrStopped",
    "LeaseReceipt",
    "IntentOverride",
    "OperatorRecord",
    "Outbox",
    "OutboxDelivered",
    "OutboxFailed",
    "Outcome",
    "Payload",
    "PolicyRebound",
    "ReviewConsumed",
    "ReviewDecided",
    "RunFailed",
    "RunFrozen",
    "RunImported",
    "RunMoved",
    "RunRetried",
    "RunStarted",
    "RunState",
    "RunStopped",
    "RunSucceeded",
    "RunThawed",
    "Session",
    "SignedRecord",
    "StepDone",
    "StepRecord",
    "act_intent",
    "act_unknown",
    "any_record",
    "approval_consumed",
    "approval_granted",
    "approval_rejected",
    "approver_added",
    "as_dict",
    "attempt_failed",
    "compatibility_verdict",
    "budget_raised",
    "consumption",
    "drive_record",
    "expect",
    "frozen_or_stopped",
    "of",
    "operator_record",
    "outbox_delivered",
    "outbox_failed",
    "outcome",
    "policy_rebound",
    "review_consumed",
    "review_decided",
    "run_failed",
    "run_frozen",
    "run_imported",
    "run_moved",
    "run_retried",
    "run_started",
    "run_state",
    "run_stopped",
    "run_succeeded",
    "run_thawed",
    "signed_record",
    "step_done",
    "step_record",
]

# Nested values (errors, evidence, limits, policy records, signed documents, receipts,
# observations) stay ``dict[str, Any]``: they are built and read by functions typed so,
# and a TypedDict is not a ``dict[str, Any]`` to mypy. Their shapes are named in comments.
ErrorRecord = dict[str, Any]  # codec.error_record: type, message (+ args, os_args)


class LeaseReceipt(TypedDict):
    """The lease a drive runs under (runtime/driving/leases.py Grant.receipt)."""

    lease_id: str  # run_id@token
    owner: str
    previous_owner: str | None
    previous_token: int
    token: int
    expires_at: float
    decision: str  # new, released, expired, same owner, dead pid N, take-over requested


class Session(TypedDict):
    """The driving session, in a drive's first record (operations/audit.py session_record)."""

    worker: str  # host:pid:nonce
    crashproof: str  # the package's version
    host: str
    pid: int
    workflow: str
    workflow_version: str
    policy_version: str | None
    fencing_token: int | None
    python: str
    lease: NotRequired[LeaseReceipt]  # journals written before 2026-12-01 lack it
    # The ledger schema the drive ran on (runtime/replayer/verdict.py compares it); journals
    # written before the compatibility verdict lack it.
    schema: NotRequired[int]


class DriveRecord(TypedDict):
    """What any record a drive writes through its Context may carry: the session, in the
    drive's first record only (runtime/context.py append_event). Records an operator or
    an import writes never do."""

    session: NotRequired[Session]


# -- a run's start and its outcomes ---------------------------------------------------


class RunStarted(TypedDict):
    """``run_started``: runtime/ledger.py ``_record``; the approvers registry's first record
    (runtime/operations/oversight.py) has only workflow, version and input_digest."""

    workflow: str
    version: str
    input_digest: str
    limits: NotRequired[LimitsRecord]  # the run was started with cp.Limits
    policy: NotRequired[PolicyRecord]  # the run was started with a cp.Policy
    # worker, crashproof, host, pid (runtime/operations/audit.py started_by); absent in
    # journals before the audit timeline and in the registry's first record.
    started_by: NotRequired[dict[str, Any]]


class RunSucceeded(DriveRecord):
    """``run_succeeded``: the session (the result is the record's value)."""

    completion: NotRequired[dict[str, Any]]  # checks it required (runtime/guards/completion)


class RunFailed(DriveRecord):
    """``run_failed``: runtime/drive.py; runtime/guards/review.py for a reviewer's abort."""

    error: ErrorRecord
    review: NotRequired[dict[str, Any]]  # an abort: the review_consumed payload


class RunFrozen(DriveRecord):
    """``run_frozen``: runtime/context.py ``freeze`` (needs_review), runtime/guards/policy.py
    (awaiting_approval), runtime/operations/transfer.py (an imported copy)."""

    status: str  # RunStatus.NEEDS_REVIEW or AWAITING_APPROVAL
    reason: str
    evidence: dict[str, Any]
    # Both absent in an imported copy's freeze (transfer.py) and in journals before the
    # act protocol; readers take a missing retryable as False.
    retryable: NotRequired[bool]
    error: NotRequired[ErrorRecord]  # what the workflow saw: the same error is raised again


class RunStopped(DriveRecord):
    """``run_stopped``: runtime/guards/budget.py (a budget), steps/outage.py (a service)."""

    status: str  # RunStatus.STOPPED
    reason: str  # budget:<kind>, or unavailable:<key>: <message>
    evidence: dict[str, Any]  # next_step, next_kind; limit, used, limits; or "unavailable"


class RunRetried(TypedDict):
    """``run_retried``: runtime/driving/retrying.py (an operator re-drives a failed run)."""

    by: str
    host: str
    status: str  # "running"
    retried: str | None  # the failed call attempted again (failed_seq: its record's seq)
    failed_seq: int | None


class RunThawed(DriveRecord):
    """``run_thawed``: runtime/context.py ``thaw`` (a resume lifts a retryable freeze): the
    status; a human's thaw (operations/oversight.py, guards/review.py): who, which record."""

    status: str  # "running"
    by: NotRequired[str]  # the operator who submitted it (for a continue: the reviewer)
    approval_seq: NotRequired[int]  # thawed by the approval_granted at that seq
    rejection_seq: NotRequired[int]  # thawed by the approval_rejected at that seq
    decision_seq: NotRequired[int]  # thawed by the review_decided at that seq


# -- steps and acts -----------------------------------------------------------------


class StepRecord(DriveRecord, total=False):
    """What a reader of any step record (step_done, attempt_failed, act_intent,
    act_unknown; journal/fold.py) may find: the keys they share, each absent where its
    record type has none. A view for reading across the four types, not a written shape."""

    kind: Required[str]  # a StepKind value
    digest: Required[str]  # the arguments' digest (an act: its intent digest)
    attempt: Required[int]
    started_at: float
    ended_at: float
    took_us: int
    error: ErrorRecord
    operation_id: str
    intent_digest: str


class Outbox(TypedDict):
    """An outbox act's message, in its step_done (runtime/steps/outbox.py)."""

    tool: str
    message: dict[str, Any]  # the act's params


class StepDone(DriveRecord):
    """``step_done``, a step's final outcome. Written by runtime/context.py (steps,
    decisions, patched markers: succeeded or failed), runtime/steps/act_records.py (an
    act's receipt), runtime/steps/acts.py (an act that failed), runtime/steps/outbox.py
    (an outbox act) and runtime/guards/policy.py (an act the policy refused)."""

    kind: str  # a StepKind value
    digest: str
    status: str  # StepStatus.SUCCEEDED or FAILED
    attempt: int  # 0: a policy refusal, never attempted
    # Successful steps and act receipts: the duration, ending at the record's created_at.
    took_us: NotRequired[int]
    # Failed steps, markers, outbox acts, refusals; successful steps and receipts of
    # journals before took_us (journal/fold.py step_times reads both forms).
    started_at: NotRequired[float]
    ended_at: NotRequired[float]
    error: NotRequired[ErrorRecord]  # failed: the error replay raises again
    # A decision that returned a cp.Decision: all three, each possibly None.
    model: NotRequired[str | None]
    usage: NotRequired[dict[str, int] | None]
    cost: NotRequired[float | None]
    # A decision's request (JSON text): what it adds to the last (runtime/operations/requests.py).
    # Stored beside the record since schema 9 (Store.load_requests), the record holding the
    # SHA-256 of its UTF-8 text, its last field; inline (``request``) in older journals.
    request: NotRequired[str]
    request_sha256: NotRequired[str]
    operation_id: NotRequired[str]  # acts
    intent_digest: NotRequired[str]  # acts (the same as digest)
    # An act's receipt: tool, tool_version, receipt_id, result_digest, reconciled, intent_bound.
    receipt: NotRequired[dict[str, Any]]
    observed: NotRequired[dict[str, Any]]  # the environment the act left (an Observation)
    outbox: NotRequired[Outbox]
    # failed acts: "permanent", "retryable", "policy", "not_done", "rejected"
    failure: NotRequired[str]
    not_done: NotRequired[dict[str, Any]]  # who decided it (runtime/steps/unknown.py)
    rejected: NotRequired[
        dict[str, Any]
    ]  # its rejection: seq, approver, reason (guards/rejections.py)
    cause: NotRequired[ErrorRecord]  # failed acts: the tool's own error
    # Policy refusals: the policy record with rule, reason, tool, tool_version.
    policy: NotRequired[dict[str, Any]]


class AttemptFailed(DriveRecord):
    """``attempt_failed``: runtime/context.py (one failed attempt, retried after retry_in)."""

    kind: str
    digest: str
    attempt: int
    error: ErrorRecord
    started_at: float
    ended_at: float
    retry_in: float  # seconds: a resume finishes the wait


class ActIntent(DriveRecord):
    """``act_intent``: runtime/steps/act_records.py (before a tool executes, per attempt);
    the params and prepared data are the record's value."""

    kind: str  # "act"
    digest: str
    operation_id: str
    intent_digest: str
    tool: str
    tool_version: str
    attempt: int
    started_at: float
    # The first attempt's, and the next one's after a stop that released the act's hold
    # (runtime/steps/outage.py none_done): {"before", "expected"} (environment.py) and
    # {tool, params} with no version (store/intents.py).
    observed: NotRequired[dict[str, Any]]
    hold_digest: NotRequired[str]
    # Runs holding the same intent that an operator let this act pass (intent_override).
    overrides: NotRequired[list[str]]
    server_at: NotRequired[float]  # the ledger server's clock, tools with a window (windows.py)
    on_unknown: NotRequired[str]  # cp.OnUnknown, when not "review" (runtime/steps/unknown.py)


class ActUnknown(DriveRecord):
    """``act_unknown``: runtime/steps/acts.py (the tool's outcome is unknown)."""

    kind: str  # "act"
    digest: str
    operation_id: str
    attempt: int
    error: ErrorRecord
    started_at: float
    ended_at: float


class OutboxDelivered(DriveRecord):
    """``outbox_delivered``: runtime/steps/outbox.py (from a drive or from
    Ledger.dispatch_outbox, which carries no session)."""

    operation_id: str
    receipt_id: str | None
    at: float


class OutboxFailed(DriveRecord):
    """``outbox_failed``: runtime/steps/outbox.py (the message stays pending)."""

    operation_id: str
    error: ErrorRecord
    at: float


# -- operator records (journal/operator_payloads.py), approvals and reviews ------------


class ApprovalConsumed(DriveRecord):
    """``approval_consumed``: runtime/guards/approvals.py (just before the act's intent)."""

    nonce: str
    approver: str
    approval_seq: int  # the approval_granted it consumes
    statement_digest: str
    operation_id: str
    intent_digest: str
    time: float
    expires_at: NotRequired[float | None]  # the approval's expiry (records since 2026-12)


class ReviewConsumed(DriveRecord):
    """``review_consumed``: runtime/guards/review.py (at the act, or at once)."""

    case_id: str
    case_fingerprint: str
    decision: str  # "replan", "abort", "continue" (review_decided's is the document)
    nonce: str
    reviewer: str
    epoch: int  # the epoch the act runs under from now on
    quarantined: list[str]  # operation ids never used again
    time: float


class CompatibilityVerdict(DriveRecord):
    """``compatibility_verdict``: runtime/replayer/verdict.py, before a resume whose
    workflow version or ledger schema changed since the run's last drive (then under the
    drive's lease, as its first record, when ``resumable``; else with the freeze it
    causes), or by ``crashproof migrate --app`` applying declared tool contract mappings."""

    decision: str  # "resumable" or "needs_review"
    changed: dict[str, Any]  # what changed: {"workflow"|"schema": [old, new], "tools": {...}}
    versions: dict[str, Any]  # what it was computed for: workflow, schema, tools by name
    mapped: list[dict[str, Any]]  # acts a declared contract mapping maps: key, tool,
    # from_version, to_version, from_digest, to_digest (applied: replay matches to_digest)
    value_maps: list[dict[str, Any]]  # the schema migrations' maps: table, column, old, new
    defaults: list[str]  # the new columns (and the value existing rows got)
    unresolved: list[str]  # what keeps the run from going on: each blocks the verdict
    replay: dict[str, Any]  # the replay check's result (runtime/replayer/check.py)
    generation: int  # the journal's length it was computed on
    by: NotRequired[str]  # who applied it (crashproof migrate), and on which host
    host: NotRequired[str]


# -- unions readers meet ----------------------------------------------------------------

# The latest of these is a Replay's ``outcome`` (journal/fold.py).
Outcome = RunSucceeded | RunFailed | RunFrozen | RunStopped
FrozenOrStopped = RunFrozen | RunStopped  # an outcome that is no end: it names its status
# The records after which a run stands where it is (a freeze, an end, a thaw).
RunState = Outcome | RunThawed | RunRetried
Consumption = ApprovalConsumed | ReviewConsumed  # a nonce used
SignedRecord = ApprovalGranted | ApprovalRejected | ReviewDecided  # a signed document journaled
# What an operator appends (each names its own by and host), and a human's thaw.
OperatorRecord = (
    BudgetRaised
    | IntentOverride
    | PolicyRebound
    | ApproverAdded
    | ApprovalGranted
    | ApprovalRejected
    | ReviewDecided
    | RunMoved
    | RunImported
    | RunThawed
)
Payload = (
    RunStarted
    | StepDone
    | AttemptFailed
    | RunSucceeded
    | RunFailed
    | RunFrozen
    | RunThawed
    | ActIntent
    | ActUnknown
    | OutboxDelivered
    | OutboxFailed
    | RunStopped
    | BudgetRaised
    | PolicyRebound
    | ApproverAdded
    | ApprovalGranted
    | ApprovalRejected
    | ApprovalConsumed
    | ReviewDecided
    | ReviewConsumed
    | RunMoved
    | RunImported
    | CompatibilityVerdict
    | IntentOverride
    | RunRetried
)

# -- the views ------------------------------------------------------------------------

P = TypeVar("P")

# Every view is Event.payload's getter itself, typed: calling it costs less than reading
# ``event.payload`` (no descriptor lookup), where a function returning a cast costs two
# calls more — twice a read's time, on the replay path (runtime/context.py _replay).
_GETTER = vars(Event).get("payload")
if not isinstance(_GETTER, property) or _GETTER.fget is None:
    raise TypeError("journal/payloads.py reads Event.payload through its property getter")
_PAYLOAD: Callable[[Event], dict[str, Any]] = _GETTER.fget


def _view(shape: type[P]) -> Callable[[Event], P]:
    """The view of records shaped ``shape``: their payload dict as it is."""
    return cast("Callable[[Event], P]", _PAYLOAD)


run_started = _view(RunStarted)
step_done = _view(StepDone)
attempt_failed = _view(AttemptFailed)
run_succeeded = _view(RunSucceeded)
run_failed = _view(RunFailed)
run_frozen = _view(RunFrozen)
run_thawed = _view(RunThawed)
act_intent = _view(ActIntent)
act_unknown = _view(ActUnknown)
outbox_delivered = _view(OutboxDelivered)
outbox_failed = _view(OutboxFailed)
run_stopped = _view(RunStopped)
budget_raised = _view(BudgetRaised)
policy_rebound = _view(PolicyRebound)
approver_added = _view(ApproverAdded)
approval_granted = _view(ApprovalGranted)
approval_rejected = _view(ApprovalRejected)
approval_consumed = _view(ApprovalConsumed)
review_decided = _view(ReviewDecided)
review_consumed = _view(ReviewConsumed)
run_moved = _view(RunMoved)
run_imported = _view(RunImported)
compatibility_verdict = _view(CompatibilityVerdict)
intent_override = _view(IntentOverride)
run_retried = _view(RunRetried)
# Views over several record types (the caller knows only which few, or none: any_record).
step_record = _view(StepRecord)
drive_record = _view(DriveRecord)
outcome = cast("Callable[[Event], Outcome]", _PAYLOAD)
frozen_or_stopped = cast("Callable[[Event], FrozenOrStopped]", _PAYLOAD)
run_state = cast("Callable[[Event], RunState]", _PAYLOAD)
consumption = cast("Callable[[Event], Consumption]", _PAYLOAD)
signed_record = cast("Callable[[Event], SignedRecord]", _PAYLOAD)
operator_record = cast("Callable[[Event], OperatorRecord]", _PAYLOAD)
any_record = cast("Callable[[Event], Payload]", _PAYLOAD)


def expect(event: Event, *types: EventType) -> None:
    """Refuse a record of another type than ``types``: for a function handed one record
    whose type it does not test itself, where another would be its caller's bug. Not for
    hot paths (the views never check)."""
    if event.type not in types:
        names = " or ".join(t.value for t in types)
        raise TypeError(
            f"run {event.run_id!r} record {event.seq} is a {event.type.value} record, not {names}"
        )


def of(shape: type[P], payload: dict[str, Any]) -> P:
    """A payload dict not read from a record (a function's argument), read as ``shape``:
    the same dict."""
    return cast(P, payload)


def as_dict(payload: Payload) -> dict[str, Any]:
    """A payload built as its TypedDict, as the ``dict[str, Any]`` that ``Event`` and
    ``Context.append_event`` take: the same dict (a TypedDict is a plain dict at run time,
    but not a ``dict[str, Any]`` to mypy)."""
    return cast("dict[str, Any]", payload)
