"""The public names are a promise: this test changes only when the promise does."""

from __future__ import annotations

import crashproof as cp

PUBLIC = [
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


def test_all_is_sorted_and_pinned() -> None:
    assert cp.__all__ == sorted(cp.__all__)
    assert cp.__all__ == PUBLIC


def test_every_public_name_exists() -> None:
    missing = [name for name in cp.__all__ if not hasattr(cp, name)]
    assert missing == []


def test_errors_share_one_root_except_the_simulated_crash() -> None:
    errors = [
        obj
        for name in cp.__all__
        if isinstance(obj := getattr(cp, name), type) and issubclass(obj, BaseException)
    ]
    assert cp.SimulatedCrash in errors
    for error in errors:
        if error is cp.SimulatedCrash:
            # Code written with ``except Exception`` must not swallow a simulated crash.
            assert not issubclass(error, Exception)
        else:
            assert issubclass(error, cp.CrashproofError), error


def test_design_section_12_names_are_exported() -> None:
    promised = {
        "Ledger", "Context", "Decision", "RunInfo", "StepInfo", "CrashproofError",
        "RunFrozen", "RunFailed", "RunConflict", "NonDeterminismError", "ReceiptConflict",
        "IntegrityError", "StaleLeaseError", "LeaseHeld", "OutcomeUnknown", "RetryableError",
        "PermanentError", "ActFailed", "workflow", "Tool", "Call", "Receipt", "Workspace",
    }  # fmt: skip
    assert promised <= set(cp.__all__)


def test_import_crashproof_leaves_the_runtime_for_first_use() -> None:
    """``import crashproof`` loads the errors, ``Tool``, the options and the records; the
    runtime, the stores, the integrity kit (and ``cryptography``) load when a name that
    needs them is first used (an integration's import does not pay for them)."""
    import subprocess
    import sys

    code = (
        "import sys, crashproof as cp\n"
        "heavy = ('crashproof.runtime.ledger', 'crashproof.runtime.context', "
        "'crashproof.store.sql', 'crashproof.integrity.signing', 'cryptography')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "ledger = cp.Ledger\n"
        "print('crashproof.runtime.ledger' in sys.modules, cp.Ledger is ledger)\n"
        "from crashproof import AsyncContext, workflow\n"
        "print(AsyncContext.__module__, workflow.__module__, 'Ledger' in dir(cp))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        "[]",
        "True True",
        "crashproof.runtime.async_context crashproof.runtime.workflow True",
    ]
