"""crashproof: long AI-agent runs that survive crashes.

A run resumes where it stopped, no recorded step runs again, no recorded model
decision is asked again, and a replay that would diverge stops with an explained
refusal instead. See the README for the guarantees and their limits.

``import crashproof`` loads the small modules every integration needs at import (the
errors, ``Tool`` and its records, the options, the journal's records); the runtime
(``Ledger``, the contexts, the workers), the integrity kit and the rest load on first
use of their name (PEP 562), so an integration's import does not pay for what its
agent has not used yet. ``__all__`` and ``from crashproof import X`` are unchanged.
"""

from typing import TYPE_CHECKING

from crashproof._version import __version__
from crashproof.errors import (
    ActFailed,
    ActNotDone,
    ApprovalRefused,
    ApprovalRejected,
    ApprovalRequired,
    AsyncMisuse,
    CancelRefused,
    CheckpointRejected,
    CrashproofError,
    DecisionRefused,
    DriftError,
    DriveCancelled,
    EnvironmentChanged,
    ForkRefused,
    IntegrityError,
    IntentHeld,
    JournalRolledBack,
    JournalTampered,
    KeyUnusable,
    LeaseHeld,
    LedgerError,
    NonDeterminismError,
    NotALedger,
    OutcomeUnknown,
    PermanentError,
    PolicyMismatch,
    PolicyViolation,
    ReceiptConflict,
    ResourceBusy,
    RetryableError,
    RetryRefused,
    RunCancelled,
    RunConflict,
    RunFailed,
    RunFrozen,
    RunMoved,
    RunNotFound,
    RunStopped,
    SchemaTooNew,
    SerializationError,
    SimulatedCrash,
    StaleLeaseError,
    Unavailable,
    UnknownKeyId,
    UnknownWorkflow,
    Unverified,
    WitnessMissing,
)
from crashproof.journal.records import (
    Budget,
    Limits,
    RunInfo,
    RunStatus,
    StepInfo,
    StepKind,
    StepStatus,
)
from crashproof.runtime.options import (
    Decision,
    RetryPolicy,
    RunOptions,
    StepOptions,
)
from crashproof.tools.port import (
    Call,
    Observation,
    OnUnknown,
    Receipt,
    Tool,
)

if TYPE_CHECKING:  # what __getattr__ loads on first use, for the type checkers
    from crashproof._faults import CrashPoints
    from crashproof.integrity.external import SealedState
    from crashproof.integrity.keys import Keyring
    from crashproof.journal.transcript import Transcript
    from crashproof.runtime.async_context import AsyncContext
    from crashproof.runtime.context import Context
    from crashproof.runtime.guards.approvers import Approver
    from crashproof.runtime.guards.completion import Completion
    from crashproof.runtime.guards.policy import Policy
    from crashproof.runtime.guards.review import ReviewCase
    from crashproof.runtime.ledger import Ledger
    from crashproof.runtime.operations.transfer import ImportPlan
    from crashproof.runtime.replayer.check import ReplayVerdict
    from crashproof.runtime.replayer.sources import replay_check
    from crashproof.runtime.steps.checks import CheckResult
    from crashproof.runtime.steps.scopes import LiveCall
    from crashproof.runtime.worker import Worker
    from crashproof.runtime.workflow import Workflow, workflow
    from crashproof.tools.outbox import Message, Outbox
    from crashproof.tools.shell import Shell
    from crashproof.tools.workspace import Workspace

# name -> the module that defines it, imported on first use
_LAZY = {
    "CrashPoints": "crashproof._faults",
    "SealedState": "crashproof.integrity.external",
    "Keyring": "crashproof.integrity.keys",
    "Transcript": "crashproof.journal.transcript",
    "AsyncContext": "crashproof.runtime.async_context",
    "Context": "crashproof.runtime.context",
    "Approver": "crashproof.runtime.guards.approvers",
    "Completion": "crashproof.runtime.guards.completion",
    "Policy": "crashproof.runtime.guards.policy",
    "ReviewCase": "crashproof.runtime.guards.review",
    "Ledger": "crashproof.runtime.ledger",
    "ImportPlan": "crashproof.runtime.operations.transfer",
    "ReplayVerdict": "crashproof.runtime.replayer.check",
    "replay_check": "crashproof.runtime.replayer.sources",
    "CheckResult": "crashproof.runtime.steps.checks",
    "LiveCall": "crashproof.runtime.steps.scopes",
    "Worker": "crashproof.runtime.worker",
    "Workflow": "crashproof.runtime.workflow",
    "workflow": "crashproof.runtime.workflow",
    "Message": "crashproof.tools.outbox",
    "Outbox": "crashproof.tools.outbox",
    "Shell": "crashproof.tools.shell",
    "Workspace": "crashproof.tools.workspace",
}

__all__ = [
    "ActFailed",
    "ActNotDone",
    "ApprovalRefused",
    "ApprovalRejected",
    "ApprovalRequired",
    "Approver",
    "AsyncContext",
    "AsyncMisuse",
    "Budget",
    "Call",
    "CancelRefused",
    "CheckResult",
    "CheckpointRejected",
    "Completion",
    "Context",
    "CrashPoints",
    "CrashproofError",
    "Decision",
    "DecisionRefused",
    "DriftError",
    "DriveCancelled",
    "EnvironmentChanged",
    "ForkRefused",
    "ImportPlan",
    "IntegrityError",
    "IntentHeld",
    "JournalRolledBack",
    "JournalTampered",
    "KeyUnusable",
    "Keyring",
    "LeaseHeld",
    "Ledger",
    "LedgerError",
    "Limits",
    "LiveCall",
    "Message",
    "NonDeterminismError",
    "NotALedger",
    "Observation",
    "OnUnknown",
    "Outbox",
    "OutcomeUnknown",
    "PermanentError",
    "Policy",
    "PolicyMismatch",
    "PolicyViolation",
    "Receipt",
    "ReceiptConflict",
    "ReplayVerdict",
    "ResourceBusy",
    "RetryPolicy",
    "RetryRefused",
    "RetryableError",
    "ReviewCase",
    "RunCancelled",
    "RunConflict",
    "RunFailed",
    "RunFrozen",
    "RunInfo",
    "RunMoved",
    "RunNotFound",
    "RunOptions",
    "RunStatus",
    "RunStopped",
    "SchemaTooNew",
    "SealedState",
    "SerializationError",
    "Shell",
    "SimulatedCrash",
    "StaleLeaseError",
    "StepInfo",
    "StepKind",
    "StepOptions",
    "StepStatus",
    "Tool",
    "Transcript",
    "Unavailable",
    "UnknownKeyId",
    "UnknownWorkflow",
    "Unverified",
    "WitnessMissing",
    "Worker",
    "Workflow",
    "Workspace",
    "__version__",
    "replay_check",
    "workflow",
]


def __getattr__(name: str) -> object:
    # A lazy name is imported once, then set on the module (no __getattr__ after that).
    # ``cp.models`` without ``import crashproof.models``: loaded on first use only, so
    # ``import crashproof`` never imports a model SDK (the extras) or pays for them.
    import importlib

    if name == "models":
        return importlib.import_module("crashproof.models")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'crashproof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
