"""The payloads of the records an operator appends (each names its own ``by`` and
``host``): budgets, policies, intent overrides, the approvers registry, approvals,
rejections, review decisions, moves and imports. Their shapes, declared once; read and
written through ``crashproof.journal.payloads``, which re-exports them (its docstring
says how), as the rest of every record's shape.
"""

# No ``from __future__ import annotations``: see journal/payloads.py (NotRequired keys).
from typing import Any, TypedDict

LimitsRecord = dict[str, int | float | None]  # records.Limits.to_json(): a limit per kind
PolicyRecord = dict[str, Any]  # runtime/guards/policy.py Policy.record(): version, digest, identity

__all__ = [
    "LimitsRecord",
    "PolicyRecord",
    "ApprovalGranted",
    "ApprovalRejected",
    "ApproverAdded",
    "BudgetRaised",
    "IntentOverride",
    "PolicyRebound",
    "ReviewDecided",
    "RunImported",
    "RunMoved",
]


class BudgetRaised(TypedDict):
    """``budget_raised``: runtime/guards/budget.py (an operator raised the limits)."""

    by: str
    host: str
    old: LimitsRecord
    new: LimitsRecord
    changed: dict[str, list[int | float | None]]  # kind -> [old, new], changed kinds only


class IntentOverride(TypedDict):
    """``intent_override``: runtime/steps/holds.py (an operator lets the act at the
    record's key execute although the named runs hold the same intent unresolved)."""

    by: str
    host: str
    intent_digest: str
    holders: list[str]  # the run ids the operator overrides, and only those
    # What the run waited on (stopped; an earlier version froze): each holder's
    # {"run_id", "key", "since"}.
    held: list[dict[str, Any]]


class PolicyRebound(TypedDict):
    """``policy_rebound``: runtime/guards/binding.py (an operator re-bound the run)."""

    by: str
    host: str
    old: PolicyRecord | None  # None: the run had no policy
    new: PolicyRecord


class ApproverAdded(TypedDict):
    """``approver_added``, in the registry run: runtime/guards/approvers.py."""

    by: str
    host: str
    time: float
    name: str
    public_key: str  # PEM
    fingerprint: str


class ApprovalGranted(TypedDict):
    """``approval_granted``: runtime/operations/oversight.py."""

    by: str
    host: str
    time: float
    approval: dict[str, Any]  # the signed document: statement, signature


class ApprovalRejected(TypedDict):
    """``approval_rejected``: runtime/operations/oversight.py (guards/rejections.py)."""

    by: str
    host: str
    time: float
    rejection: dict[str, Any]  # the signed document: statement (with the reason), signature


class ReviewDecided(TypedDict):
    """``review_decided``: runtime/operations/oversight.py."""

    by: str
    host: str
    time: float
    case_id: str
    decision: dict[str, Any]  # the signed document: statement, signature (not a name)


class RunMoved(TypedDict):
    """``run_moved``: runtime/operations/moving.py (exported as a move)."""

    by: str
    host: str
    time: float
    generation: int
    left: str  # the status the run left in


class RunImported(TypedDict):
    """``run_imported``: runtime/operations/transfer.py."""

    by: str
    host: str
    time: float
    checkpoint: str  # the document's digest
    generation: int
    transfer: str  # "move" or "copy"
    format: int  # the document's schema version
    signed_with: str  # the id of the key that signed the document
