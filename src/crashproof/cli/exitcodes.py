"""Exit codes scripts can trust, and the mapping from every error to one of them.

The mapping is data (``_RULES``): the first rule whose exception class matches wins,
so subclasses are listed before their parents.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass

from crashproof.errors import (
    ApprovalRefused,
    CancelRefused,
    CrashproofError,
    DecisionRefused,
    ForkRefused,
    IntegrityError,
    JournalRolledBack,
    KeyUnusable,
    LeaseHeld,
    LedgerError,
    NotALedger,
    RetryRefused,
    RunCancelled,
    RunConflict,
    RunFailed,
    RunFrozen,
    RunMoved,
    RunNotFound,
    RunStopped,
    SchemaTooNew,
    StaleLeaseError,
    UnknownKeyId,
    UnknownWorkflow,
    WitnessMissing,
)
from crashproof.runtime.steps.holds import NothingToOverride, waits_for_holder

__all__ = ["EXIT_CODES_TEXT", "SIGNAL_EXIT_TEXT", "CliError", "ExitCode", "Failure", "failure_for"]


class ExitCode(enum.IntEnum):
    """The process exit status of every ``crashproof`` command."""

    OK = 0
    RUN_FAILED = 1
    USAGE = 2
    RUN_FROZEN = 3
    CONFLICT = 4
    LEDGER_UNUSABLE = 5
    RUN_INTERRUPTED = 6
    RUN_CANCELLED = 7
    UNDELIVERED = 8
    INTERNAL = 70
    INTERRUPTED = 130


# One line per code, shown in ``crashproof --help`` and the package docstring.
EXIT_CODES_TEXT: dict[ExitCode, str] = {
    ExitCode.OK: "ok (for run and resume: the run succeeded)",
    ExitCode.RUN_FAILED: "the run failed; recorded, so re-running returns the same failure "
    "(crashproof retry RUN attempts the failed call again)",
    ExitCode.USAGE: "usage or input error (option, module, --arg, URL, run id); nothing changed",
    ExitCode.RUN_FROZEN: "the run is frozen (needs_review, awaiting_approval): waits for a human",
    ExitCode.CONFLICT: "conflict: run id reused with another input, run owned by another worker "
    "or moved to another ledger, retry of a run that is not failed, cancel of an ended run, "
    "an approval or rejection of an act the run does not wait on (or decided already), "
    "a review decision the case does not take or a signer the ledger does not trust",
    ExitCode.LEDGER_UNUSABLE: "ledger unusable (missing, not a ledger, corrupt, newer, locked); "
    "for runs and check: some runs fail verification (the rest are listed, those marked)",
    ExitCode.RUN_INTERRUPTED: "the run stopped, stays resumable (an error, a budget, a service "
    "out, another run holding its act's intent): fix it or wait, then resume",
    ExitCode.RUN_CANCELLED: "the run was cancelled (crashproof cancel): it is never driven "
    "again; nothing was executed",
    ExitCode.UNDELIVERED: "show: the run has outbox messages still undelivered (a target "
    "was down): `crashproof dispatch --app MODULE` delivers them",
    ExitCode.INTERNAL: "internal error (a bug): rerun with --verbose for the traceback",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


# Not a code crashproof returns: the shell's status of a process a signal stopped.
SIGNAL_EXIT_TEXT = (
    "stopped by signal N (SIGKILL: 137 in a shell, -9 from Python's subprocess; SIGTERM: "
    "143): nothing recorded is lost, resume the run"
)


class CliError(Exception):
    """An error the CLI itself detected: a message, a hint, an exit code."""

    def __init__(self, code: ExitCode, message: str, hint: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


@dataclass(frozen=True, slots=True)
class Failure:
    """What the user sees when a command fails: one error line, one hint line."""

    code: ExitCode
    message: str
    hint: str


def _run_id(exc: BaseException) -> str:
    """The run id as a shell word, ready to paste into a suggested command: run ids often
    come from outside input (issue titles, branch names), and ``q$(touch x)`` must stay
    a literal."""
    run_id = getattr(exc, "run_id", None)
    return shlex.quote(str(run_id)) if run_id else "RUN_ID"


def _hint_failed(exc: CrashproofError) -> str:
    run = _run_id(exc)
    return (
        f"see `crashproof show {run}`; once the cause is fixed, `crashproof retry {run} --app "
        "MODULE` attempts the failed call again under the same run id (recorded effects "
        "replay, never repeat); a new run id would repeat them"
    )


def _hint_frozen(exc: CrashproofError) -> str:
    run = _run_id(exc)
    if getattr(exc, "status", None) == "awaiting_approval":
        then = f"approve it: `crashproof approve {run} --key KEY.pem`, then resume"
    else:
        then = f"decide: `crashproof review list {run}`, `crashproof review decide CASE ...`"
    return (
        f"it executes nothing until a human decides; inspect the evidence with "
        f"`crashproof show {run}`, then {then}"
    )


def _hint_stopped(exc: CrashproofError) -> str:
    run = _run_id(exc)
    if waits_for_holder(getattr(exc, "reason", None)):  # runtime/steps/holds.py
        return (
            "another run holds the same act intent unresolved and nothing was sent: a worker "
            "(`crashproof worker`) resumes this run with backoff and it goes on once that run "
            "(named above) resolved its act; or let this act pass it: "
            f"`crashproof resume {run} --app MODULE --override-intent RUN --by NAME`"
        )
    if str(getattr(exc, "reason", "")).startswith("unavailable:"):  # runtime/steps/outage.py
        return (
            "a service the run needs is out; nothing of the call was recorded: once it is "
            f"back, `crashproof resume {run} --app MODULE` attempts it again"
        )
    if str(getattr(exc, "reason", "")).startswith("unverified:"):  # guards/completion.py
        return (
            "its required check did not pass at the state it leaves; nothing was lost: let "
            "the workflow check again after its last change, then "
            f"`crashproof resume {run} --app MODULE` (`crashproof show {run}` has the evidence)"
        )
    return f"the run stays resumable: fix the cause, then `crashproof resume {run} --app MODULE`"


def _hint_conflict(exc: CrashproofError) -> str:
    return (
        "use another --run-id for another input, or repeat the original --arg values "
        f"(`crashproof show {_run_id(exc)} --json` shows them)"
    )


_Rule = tuple[type[CrashproofError], ExitCode, str]

_RULES: tuple[_Rule, ...] = (
    (RunFailed, ExitCode.RUN_FAILED, ""),
    (RunFrozen, ExitCode.RUN_FROZEN, ""),
    (RunConflict, ExitCode.CONFLICT, ""),
    (RunStopped, ExitCode.RUN_INTERRUPTED, ""),
    (
        RunCancelled,
        ExitCode.RUN_CANCELLED,
        "`crashproof show RUN_ID` shows who cancelled it and why; to do the work again, "
        "start a new run (or `crashproof fork` it from a step)",
    ),
    (
        ForkRefused,
        ExitCode.CONFLICT,
        "`crashproof show RUN_ID` lists the steps it completed; fork from one of them",
    ),
    (
        CancelRefused,
        ExitCode.CONFLICT,
        "`crashproof show RUN_ID` shows how it ended; only a run that has not ended is cancelled",
    ),
    (
        RetryRefused,
        ExitCode.CONFLICT,
        "`crashproof show RUN_ID` shows its status; `crashproof resume` drives a stopped or "
        "running run on",
    ),
    (
        NothingToOverride,
        ExitCode.USAGE,
        "--override-intent names a run the waiting act waits for: see the stop's reason "
        "in `crashproof show RUN_ID`",
    ),
    (
        ApprovalRefused,
        ExitCode.CONFLICT,
        "sign a fresh approval of the act the run waits on now (`crashproof show RUN_ID`), "
        "with a key in `crashproof approvers list`",
    ),
    (
        DecisionRefused,
        ExitCode.CONFLICT,
        "review the case as it is now (`crashproof review show CASE`) and sign again, with a "
        "key in `crashproof approvers list`",
    ),
    (
        LeaseHeld,
        ExitCode.CONFLICT,
        "another worker owns the run: wait until its lease expires and resume, or take it "
        "over with `crashproof resume RUN_ID --app MODULE --take-over` (fences the other "
        "worker out)",
    ),
    (
        RunMoved,
        ExitCode.CONFLICT,
        "the run continues where its checkpoint was imported: `crashproof resume` it there; "
        "to continue it here instead, `crashproof import` that checkpoint back into this ledger",
    ),
    (
        StaleLeaseError,
        ExitCode.CONFLICT,
        "another worker took the run over; let it finish, or resume once its lease expires",
    ),
    (
        UnknownWorkflow,
        ExitCode.USAGE,
        "pass --app MODULE naming the module that defines the run's workflow, "
        "at the version the run started on",
    ),
    (
        RunNotFound,
        ExitCode.USAGE,
        "`crashproof runs` lists the runs of this ledger; check --db / CRASHPROOF_DB",
    ),
    (
        NotALedger,
        ExitCode.LEDGER_UNUSABLE,
        "point --db (or CRASHPROOF_DB) at a crashproof ledger, or at a new file",
    ),
    (
        SchemaTooNew,
        ExitCode.LEDGER_UNUSABLE,
        "upgrade crashproof (pip install -U crashproof) to open this ledger",
    ),
    (
        LedgerError,
        ExitCode.LEDGER_UNUSABLE,
        "check the --db path, and that no other process holds the ledger locked",
    ),
    (
        KeyUnusable,
        ExitCode.LEDGER_UNUSABLE,
        "set CRASHPROOF_KEY (hex) or CRASHPROOF_KEY_FILE (a file only its owner can read); "
        "`crashproof keygen` makes one",
    ),
    (
        UnknownKeyId,
        ExitCode.LEDGER_UNUSABLE,
        "open the ledger with the key it was written with (keep old keys in a Keyring)",
    ),
    (
        WitnessMissing,
        ExitCode.LEDGER_UNUSABLE,
        "if you trust this journal: crashproof reanchor RUN_ID --by NAME",
    ),
    (
        JournalRolledBack,
        ExitCode.LEDGER_UNUSABLE,
        "restore the newest copy of the ledger; an older one would redo recorded work",
    ),
    (
        IntegrityError,
        ExitCode.LEDGER_UNUSABLE,
        "restore the ledger from a backup, or point --db at another file",
    ),
)

_DYNAMIC_HINTS = {
    RunFailed: _hint_failed,
    RunFrozen: _hint_frozen,
    RunConflict: _hint_conflict,
    RunStopped: _hint_stopped,
}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def failure_for(exc: Exception) -> Failure | None:
    """The failure to report for ``exc``, or None when it is not one we expect (a bug)."""
    if isinstance(exc, CliError):
        return Failure(exc.code, _one_line(exc.message), _one_line(exc.hint))
    if not isinstance(exc, CrashproofError):
        return None
    for cls, code, hint in _RULES:
        if isinstance(exc, cls):
            dynamic = _DYNAMIC_HINTS.get(cls)
            text = dynamic(exc) if dynamic is not None else hint
            return Failure(code, _one_line(str(exc)), text)
    # Any other CrashproofError escaping run/resume (a non-JSON result, a nested ctx
    # call, an unknown tool outcome) leaves the run resumable: the ledger refused to
    # record it as the run's failure.
    return Failure(
        ExitCode.RUN_INTERRUPTED,
        _one_line(f"{type(exc).__name__}: {exc}"),
        "the run stays resumable: fix the cause, then `crashproof resume RUN_ID --app MODULE`",
    )
