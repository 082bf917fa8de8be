"""crashproof: long AI-agent runs that survive crashes.

A run resumes where it stopped, no recorded step runs again, no recorded model
decision is asked again, and a replay that would diverge stops with an explained
refusal instead. See the README for the guarantees and their limits.
"""

from crashproof._faults import CrashPoints
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
from crashproof.integrity.external import SealedState
from crashproof.integrity.keys import Keyring
from crashproof.journal.records import (
    Budget,
    Limits,
    RunInfo,
    RunStatus,
    StepInfo,
    StepKind,
    StepStatus,
)
from crashproof.journal.transcript import Transcript
from crashproof.runtime.async_context import AsyncContext
from crashproof.runtime.context import Context
from crashproof.runtime.guards.approvers import Approver
from crashproof.runtime.guards.completion import Completion
from crashproof.runtime.guards.policy import Policy
from crashproof.runtime.guards.review import ReviewCase
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.operations.transfer import ImportPlan
from crashproof.runtime.options import Decision, RetryPolicy, RunOptions, StepOptions
from crashproof.runtime.replayer.check import ReplayVerdict
from crashproof.runtime.replayer.sources import replay_check
from crashproof.runtime.steps.checks import CheckResult
from crashproof.runtime.steps.scopes import LiveCall
from crashproof.runtime.worker import Worker
from crashproof.runtime.workflow import Workflow, workflow
from crashproof.tools.outbox import Message, Outbox
from crashproof.tools.port import Call, Observation, OnUnknown, Receipt, Tool
from crashproof.tools.shell import Shell
from crashproof.tools.workspace import Workspace

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
    # ``cp.models`` without ``import crashproof.models``: loaded on first use only, so
    # ``import crashproof`` never imports a model SDK (the extras) or pays for them.
    if name == "models":
        import importlib

        return importlib.import_module("crashproof.models")
    raise AttributeError(f"module 'crashproof' has no attribute {name!r}")
