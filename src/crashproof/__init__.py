"""crashproof: long AI-agent runs that survive crashes.

A run resumes where it stopped, no recorded step runs again, no recorded model
decision is asked again, and a replay that would diverge stops with an explained
refusal instead. See the README for the guarantees and their limits.
"""

from crashproof._faults import CrashPoints
from crashproof.errors import (
    ActFailed,
    CrashproofError,
    DriftError,
    IntegrityError,
    LeaseHeld,
    LedgerError,
    NonDeterminismError,
    NotALedger,
    OutcomeUnknown,
    PermanentError,
    ReceiptConflict,
    RetryableError,
    RunConflict,
    RunFailed,
    RunFrozen,
    RunNotFound,
    SchemaTooNew,
    SerializationError,
    SimulatedCrash,
    StaleLeaseError,
    UnknownWorkflow,
)
from crashproof.journal.records import (
    Budget,
    RunInfo,
    RunStatus,
    StepInfo,
    StepKind,
    StepStatus,
)
from crashproof.runtime.context import Context
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.options import Decision, RetryPolicy, StepOptions
from crashproof.runtime.workflow import Workflow, workflow
from crashproof.tools.outbox import Message, Outbox
from crashproof.tools.port import Call, Receipt, Tool
from crashproof.tools.workspace import Workspace

__version__ = "0.1.0"

__all__ = [
    "ActFailed",
    "Budget",
    "Call",
    "Context",
    "CrashPoints",
    "CrashproofError",
    "Decision",
    "DriftError",
    "IntegrityError",
    "LeaseHeld",
    "Ledger",
    "LedgerError",
    "Message",
    "NonDeterminismError",
    "NotALedger",
    "Outbox",
    "OutcomeUnknown",
    "PermanentError",
    "Receipt",
    "ReceiptConflict",
    "RetryPolicy",
    "RetryableError",
    "RunConflict",
    "RunFailed",
    "RunFrozen",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "SchemaTooNew",
    "SerializationError",
    "SimulatedCrash",
    "StaleLeaseError",
    "StepInfo",
    "StepKind",
    "StepOptions",
    "StepStatus",
    "Tool",
    "UnknownWorkflow",
    "Workflow",
    "Workspace",
    "__version__",
    "workflow",
]
