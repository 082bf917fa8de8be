"""One exception tree for everything crashproof raises.

::

    CrashproofError
    ├── LedgerError                  the ledger cannot be opened or used safely
    │   ├── NotALedger               the file/database is not a crashproof ledger
    │   └── SchemaTooNew             written by a newer crashproof
    ├── IntegrityError               stored data is corrupt, altered or inconsistent
    │   ├── KeyUnusable              no key, a malformed key, a key file others can read
    │   ├── UnknownKeyId             a record sealed with a key this keyring lacks
    │   ├── JournalTampered          a record's MAC or chain does not verify
    │   ├── JournalRolledBack        the journal is older than its witness says
    │   ├── WitnessMissing           a run has no witness row to compare with
    │   └── CheckpointRejected       an imported checkpoint failed a check; nothing written
    ├── SerializationError (+TypeError)   a value is not JSON; nothing was recorded
    ├── UnknownWorkflow              no registered workflow has that name
    ├── RunNotFound (+KeyError)      no run has that id
    ├── RunConflict                  a run id reused with another input
    ├── RunFrozen                    the run waits for a human (needs_review, ...)
    ├── RunStopped                   the run stopped cleanly (a budget, a service out); resumable
    │   └── Unverified               ... its completion evidence does not hold (cp.Completion)
    ├── RetryRefused                 a retry of a run that is not failed; nothing written
    ├── RunCancelled                 an operator cancelled the run: it is never driven again
    ├── CancelRefused                a cancel of a run that already ended; nothing written
    ├── ForkRefused                  a fork that cannot start (step, act in flight, id)
    ├── RunMoved                     the run was exported as a move: it continues elsewhere
    ├── PolicyMismatch               resumed under another policy than the run recorded
    ├── AsyncMisuse                  sync and async mixed up, or a ctx call off the run's task
    ├── DriveCancelled               an async drive was cancelled; nothing recorded, resumable
    ├── ApprovalRequired             an act's risk level needs an approval first
    ├── ApprovalRefused              a signed approval does not release the act; not journaled
    ├── DecisionRefused              a signed review decision does not fit the case; not journaled
    ├── RunFailed                    the run ended in `failed`
    ├── NonDeterminismError          replay met a call the journal does not hold
    ├── ReceiptConflict              a tool's receipt disagrees with the journal
    ├── DriftError                   the target changed in a way no intent explains
    │   └── EnvironmentChanged       on resume, the world differs from what the run saw
    ├── StaleLeaseError              another worker owns the run now
    ├── LeaseHeld                    the run is owned by someone else
    ├── IntentHeld                   another run holds the same act intent unresolved
    ├── OutcomeUnknown               a tool cannot tell whether an effect happened
    ├── RetryableError               a tool says: not done, try again
    │   └── ResourceBusy             ... someone else holds the target (a lock); frozen
    │                                    for a later resume once retries run out, never failed
    ├── PermanentError               a tool says: not done, never will be
    └── ActFailed                    a permanent failure, as the workflow sees it
        ├── PolicyViolation          an act outside the run's policy, refused unexecuted
        ├── ApprovalRejected         an approver rejected the act (also an ApprovalRefused);
        │                                never executed
        └── ActNotDone               an unknown outcome recorded as not done (at_most_once,
                                         or a reviewer's keep); never sent again

    SimulatedCrash (BaseException)   raised by armed crash points; never caught
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crashproof._excerpt import shown

__all__ = [
    "ActFailed",
    "ActNotDone",
    "ApprovalRefused",
    "ApprovalRejected",
    "AsyncMisuse",
    "ApprovalRequired",
    "CheckpointRejected",
    "CrashproofError",
    "DecisionRefused",
    "DriftError",
    "DriveCancelled",
    "EnvironmentChanged",
    "IntegrityError",
    "JournalRolledBack",
    "JournalTampered",
    "KeyUnusable",
    "IntentHeld",
    "LeaseHeld",
    "LedgerError",
    "NonDeterminismError",
    "NotALedger",
    "OutcomeUnknown",
    "PermanentError",
    "PolicyMismatch",
    "PolicyViolation",
    "ReceiptConflict",
    "ResourceBusy",
    "RetryRefused",
    "RunCancelled",
    "CancelRefused",
    "ForkRefused",
    "RetryableError",
    "RunConflict",
    "RunFailed",
    "RunFrozen",
    "RunNotFound",
    "RunMoved",
    "RunStopped",
    "SchemaTooNew",
    "SerializationError",
    "SimulatedCrash",
    "StaleLeaseError",
    "Unavailable",
    "UnknownKeyId",
    "UnknownWorkflow",
    "Unverified",
    "WitnessMissing",
]


class CrashproofError(Exception):
    """Root of every error crashproof raises on purpose."""


class LedgerError(CrashproofError):
    """The ledger cannot be opened or used safely; nothing was written."""


class NotALedger(LedgerError):
    """The target is not a crashproof ledger (another database, or not a database)."""


class SchemaTooNew(LedgerError):
    """The ledger was written by a newer crashproof; this one refuses to touch it."""

    def __init__(self, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"ledger schema version {found} is newer than this crashproof supports "
            f"(up to {supported}); nothing was changed. Upgrade crashproof to open it."
        )


class IntegrityError(CrashproofError):
    """Stored data is corrupt, altered, or inconsistent with itself."""


class KeyUnusable(IntegrityError):
    """No usable journal key: missing, malformed, or in a file others can read."""


class UnknownKeyId(IntegrityError):
    """A record was sealed with a key that is not in this keyring (wrong key?)."""


class JournalTampered(IntegrityError):
    """A journal record fails its HMAC, or the chain of records is broken."""


class JournalRolledBack(IntegrityError):
    """The journal is behind (or forked from) what its generation witness recorded:
    an older copy of the ledger was restored."""


class WitnessMissing(IntegrityError):
    """A run exists in the journal but not in the generation witness."""


class CheckpointRejected(IntegrityError):
    """A checkpoint document failed verification (signature, schema, fields, chain,
    generation) or conflicts with the ledger; nothing was imported."""


class SerializationError(CrashproofError, TypeError):
    """A value that must be stored is not JSON-serializable; nothing was recorded."""


class UnknownWorkflow(CrashproofError):
    """No workflow with that name is registered in this ledger."""


class RunNotFound(CrashproofError, KeyError):
    """No run with that id exists in this ledger."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence.
        return str(self.args[0]) if self.args else "run not found"


class RunConflict(CrashproofError):
    """A run id was reused with a different input; nothing was started."""

    def __init__(self, run_id: str, existing_digest: str, new_digest: str) -> None:
        self.run_id = run_id
        self.existing_digest = existing_digest
        self.new_digest = new_digest
        super().__init__(
            f"run {run_id!r} already exists with input digest {existing_digest}, "
            f"but this call's input digest is {new_digest}; nothing was started. "
            "Use another run id for another input."
        )


class RunFrozen(CrashproofError):
    """The run stopped in a state that needs a human (needs_review, awaiting_approval)."""

    def __init__(
        self,
        run_id: str,
        status: str,
        reason: str,
        cause: Any = None,
        *,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        self.run_id = run_id
        self.status = status
        self.reason = reason
        self.cause = cause  # the error the workflow saw (NonDeterminismError, ...)
        self.evidence = evidence
        super().__init__(f"run {run_id!r} is {status}: {reason}")


class RunFailed(CrashproofError):
    """The run ended in `failed`; `.cause` is the recorded error (whole in `.error`, its
    message shown bounded on one line here, as the run's reason is)."""

    def __init__(self, run_id: str, error: dict[str, Any], cause: BaseException | None = None):
        self.run_id = run_id
        self.error = error
        self.cause = cause
        said = shown(f"{error.get('type', 'Error')}: {error.get('message', '')}")
        super().__init__(f"run {run_id!r} failed: {said}")


class NonDeterminismError(CrashproofError):
    """Replay met a ctx call that does not match the journal: the code changed under a run."""

    def __init__(self, message: str, evidence: dict[str, Any] | None = None) -> None:
        self.evidence = evidence or {}
        super().__init__(message)


class ReceiptConflict(CrashproofError):
    """A tool's authoritative receipt disagrees with the journaled intent."""


class DriftError(CrashproofError):
    """A tool found its target in a state neither before nor after the intent (someone
    else changed it): the act is frozen for review, never forced."""


class EnvironmentChanged(DriftError):
    """On resume, an environment the run acted on is another instance, or in a state
    neither its last recorded observation nor the pending act explains: the run is frozen
    for review (old and new observations as evidence) before anything executes."""


class StaleLeaseError(CrashproofError):
    """Another worker took the run over; this one must stop before any further effect."""


class LeaseHeld(CrashproofError):
    """The run is owned by another worker until its lease expires.

    ``owner``: the holding worker's id; ``expires_at``: when its lease ends (epoch
    seconds, by the store's clock)."""

    def __init__(
        self, message: str, *, owner: str | None = None, expires_at: float | None = None
    ) -> None:
        super().__init__(message)
        self.owner = owner
        self.expires_at = expires_at


class IntentHeld(CrashproofError):
    """Another run holds the same act intent unresolved (in flight, unknown, frozen): a
    new operation id must not walk around an unknown outcome. Raised by a store refusing
    the intent record (nothing of that write is kept); the act that met it stops the run
    retryable, waiting (runtime/steps/holds.py), and the ``RunStopped`` comes from it.

    ``holders``: ``{"run_id", "key", "since"}`` of each run holding it (``since``: epoch
    seconds of its first unresolved intent record)."""

    def __init__(self, message: str, *, holders: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.holders = list(holders or ())


class RunMoved(CrashproofError):
    """The run was exported as a move (``crashproof export``): its one continuation is
    wherever that checkpoint is imported, so this ledger drives or changes it no more.

    ``generation``: the journal's generation with the move record; ``checkpoint``: the
    exported document's digest (``sha256:...``); ``by``, ``moved_at``: who, when."""

    def __init__(
        self, run_id: str, *, generation: int, checkpoint: str, by: str, moved_at: str
    ) -> None:
        self.run_id = run_id
        self.generation = generation
        self.checkpoint = checkpoint
        self.by = by
        self.moved_at = moved_at
        super().__init__(
            f"run {run_id!r} was exported at generation {generation} (checkpoint "
            f"{checkpoint}) on {moved_at} by {by}; nothing was executed or written. Resume "
            "it where that checkpoint was imported (or import the checkpoint back here to "
            "continue it here)"
        )


class OutcomeUnknown(CrashproofError):
    """A tool cannot tell whether an effect happened."""


class RetryableError(CrashproofError):
    """A tool states the effect did not happen and may be tried again."""


class ResourceBusy(RetryableError):
    """A tool states the effect did not happen because someone else holds what it needs
    (a lock file of another process). Retried like any ``RetryableError``; when the
    retries run out the act is frozen in ``needs_review`` for a later resume to try again,
    never recorded as failed: the holder may go away, and only a human can tell whether
    it will."""


class Unavailable(RetryableError):
    """A service the step, decision or act needs is out for now (a model API's 429 or
    5xx, a refused connection, a timeout): nothing happened, and it may work later.
    ``retry_after`` is the service's own hint in seconds (``Retry-After``), if it gave
    one. Retried under the call's ``RetryPolicy``; when the tries run out the run stops
    resumable (``stopped``), never ``failed``: an outage is not the run's fault."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class PermanentError(CrashproofError):
    """A tool states the effect did not happen and never will."""


class ActFailed(CrashproofError):
    """A permanent tool failure, as the workflow sees it (recorded, replayed identically)."""


class ActNotDone(ActFailed):
    """An act whose outcome was unknown and that nothing could look up, recorded as not
    done: its tool declared ``cp.OnUnknown.AT_MOST_ONCE``, or a reviewer decided
    ``keep``. The effect may have happened once; it is never sent again. Journaled as
    the act's outcome (a failed step, failure ``not_done``) and raised identically on
    replay."""


class PolicyViolation(ActFailed):
    """An act outside the run's policy (tool, contract version or scope): refused before
    its intent was committed, so nothing executed. Journaled as the act's outcome and
    raised identically on replay, whatever policy is in force then."""


class ApprovalRequired(CrashproofError):
    """An act whose risk level needs an approval: refused before its intent was committed;
    the run waits in ``awaiting_approval`` with the pending act as evidence."""

    def __init__(self, message: str, evidence: dict[str, Any] | None = None) -> None:
        self.evidence = evidence or {}
        super().__init__(message)


class ApprovalRefused(CrashproofError):
    """A signed approval that does not release the pending act (unknown signer, a
    signature that does not verify, another run, step, intent, policy or generation, a
    used nonce, expired): refused before anything was journaled or executed."""


class ApprovalRejected(ActFailed, ApprovalRefused):
    """A registered approver signed a rejection of the pending act, with a reason
    (``crashproof reject``): raised into the workflow where the act stood, which never
    executes. Journaled as the act's outcome (a failed step, failure ``rejected``) and
    raised identically on replay. An ``ActFailed`` (left uncaught, the run fails with the
    reason) and an ``ApprovalRefused`` (``except cp.ApprovalRefused`` takes it)."""


class DecisionRefused(CrashproofError):
    """A signed review decision that does not fit its case (unknown signer, a bad
    signature, another case fingerprint, a used nonce, a replan where no act is in
    flight): refused before anything was journaled or executed."""


class RunStopped(CrashproofError):
    """The run stopped cleanly in ``stopped`` (``reason`` e.g. ``budget:tokens``) before
    starting new work, with nothing in flight. ``budget`` is what it consumed
    (``cp.Budget``), ``limits`` what it may (``cp.Limits``), ``wall_seconds`` the time
    since its first start. Raise the limit and resume to continue."""

    def __init__(
        self,
        run_id: str,
        reason: str,
        budget: Any = None,
        limits: Any = None,
        *,
        wall_seconds: float = 0.0,
        detail: str = "",
    ) -> None:
        self.run_id = run_id
        self.reason = reason
        self.budget = budget
        self.limits = limits
        self.wall_seconds = wall_seconds
        self.detail = detail
        super().__init__(f"run {run_id!r} stopped: {reason}" + (f" ({detail})" if detail else ""))


class Unverified(RunStopped):
    """A run that requires completion evidence (``cp.Completion``) returned, but the last
    check of a required name did not pass at the environments it leaves: stopped,
    resumable, nothing lost. ``problems`` says why, one line each."""

    def __init__(self, run_id: str, reason: str, *, problems: Sequence[str] = ()) -> None:
        super().__init__(run_id, reason)
        self.problems = list(problems)


class RetryRefused(CrashproofError):
    """``Ledger.retry`` of a run that is not ``failed`` (or that a reviewer aborted):
    nothing was written. ``status`` is the run's."""

    def __init__(self, run_id: str, status: str, message: str) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(message)


class RunCancelled(CrashproofError):
    """The run was cancelled by an operator (``Ledger.cancel``, ``crashproof cancel``): it
    is never driven again, by resume, retry, a worker or a run with the same id. ``by`` and
    ``reason`` are the cancel's, as journaled."""

    def __init__(self, run_id: str, by: str = "", reason: str = "") -> None:
        self.run_id = run_id
        self.by = by
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"run {run_id!r} was cancelled by {by or 'an operator'}{why}: it is never driven "
            "again; nothing was executed"
        )


class CancelRefused(CrashproofError):
    """``Ledger.cancel`` of a run that already ended (succeeded, failed, cancelled) or was
    moved to another ledger: nothing was written. ``status`` is the run's."""

    def __init__(self, run_id: str, status: str, message: str) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(message)


class ForkRefused(CrashproofError):
    """``Ledger.fork`` refused: no such completed step, a prefix ending inside an act, or
    a new run id in use; nothing was written."""

    def __init__(self, run_id: str, message: str) -> None:
        self.run_id = run_id
        super().__init__(message)


class PolicyMismatch(CrashproofError):
    """A run is resumed under another policy (version or content) than the one it
    recorded; nothing was executed. Deploy the recorded policy, or re-bind the run
    explicitly (``Ledger.resume(run_id, rebind_policy=policy, by=...)``, journaled)."""

    def __init__(self, run_id: str, recorded: str | None, offered: str | None, detail: str) -> None:
        self.run_id = run_id
        self.recorded = recorded  # the run's policy version (None: it has no policy)
        self.offered = offered  # the version(s) this process offers (None: none)
        super().__init__(detail)


class AsyncMisuse(CrashproofError):
    """Sync and async mixed up (an async workflow, step function or tool met the sync
    entry point, or the reverse), or a ctx call from a task other than the workflow's
    own: refused before anything of it was recorded; the run stays resumable."""


class DriveCancelled(CrashproofError):
    """An async drive was cancelled (``asyncio.CancelledError``, ``asyncio.timeout``) inside
    a ctx call: as after a crash there, nothing of that call was recorded, nothing more
    is recorded in this drive, and the run stays resumable (an act it cancelled after
    ``execute`` began is looked up on resume)."""

    def __init__(self, run_id: str, key: str) -> None:
        super().__init__(
            f"run {run_id!r}: its drive was cancelled at {key!r}; nothing of that call was "
            "recorded and nothing more is in this drive (as after a crash there). Resume "
            "the run to go on; to bound a call's time, put the deadline inside the step"
        )
        self.run_id = run_id
        self.key = key


class SimulatedCrash(BaseException):
    """Raised by an armed crash point. Derives from BaseException so user code
    written with ``except Exception`` cannot swallow it; the runtime writes
    nothing while it unwinds, exactly as if the process had died there."""

    def __init__(self, point: str) -> None:
        self.point = point
        super().__init__(f"simulated crash at {point}")


# CrashproofErrors a workflow may legitimately end with (a tool's permanent failure).
# Any other CrashproofError escaping the workflow (a corrupt ledger, a non-JSON value,
# a lost lease) is never recorded as the run's failure: the run stays resumable once
# the cause is fixed (runtime/drive.py), and a replay check stops there (replayer).
WORKFLOW_OUTCOMES = (ActFailed, PermanentError, RetryableError)
