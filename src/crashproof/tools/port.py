"""The Tool port: how crashproof talks to anything that changes the world.

A tool executes an effect under an operation id (the idempotency key, stable across
attempts and processes) and answers a lookup: was the effect for this operation id
done, and with which intent? The receipt a tool returns is the authoritative evidence;
the ledger's copy is a cache of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, ClassVar

__all__ = ["Call", "Observation", "OnUnknown", "Receipt", "Tool"]


class OnUnknown(StrEnum):
    """What an unknown outcome means for a tool that cannot look it up (an act left in
    flight by a crash, or whose ``execute`` raised neither ``RetryableError`` nor
    ``PermanentError``). Journaled with the act's intent; the recorded one wins on resume.

    - ``REVIEW`` (the default): the run freezes in ``needs_review`` with the evidence; a
      person decides (``crashproof review decide CASE --redo | --keep | --abort``).
    - ``AT_LEAST_ONCE``: send again under the same operation id. For a target that
      dedupes by that id, or an effect whose duplicate is acceptable. Never freezes.
    - ``AT_MOST_ONCE``: record the act as not done and go on: the workflow gets
      ``cp.ActNotDone`` (an ``ActFailed``), replayed identically. The effect may have
      happened once; it never happens twice. Never freezes.
    """

    REVIEW = "review"
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


def _no_crash_point(name: str) -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One request to a tool. Everything in it is stable across attempts and processes,
    except ``attempt`` (1, 2, ...) and ``fencing_token`` (grows with each new owner)."""

    run_id: str
    step: str
    operation_id: str
    intent_digest: str
    params: dict[str, Any]
    fencing_token: int | None = None
    attempt: int = 1
    prepared: dict[str, Any] | None = None
    # The signed approval this act consumed, when its policy needed one: ``{"digest",
    # "expires_at", "approver"}``. A tool whose target others can reach forwards it, so
    # the target binds it to the effect and enforces the expiry itself.
    approval: dict[str, Any] | None = None
    # Tools call this at the instants a crash matters most ("written", "renamed"): the
    # verifier arms it; otherwise it does nothing.
    crash_point: Callable[[str], None] = field(default=_no_crash_point, repr=False)


@dataclass(frozen=True, slots=True)
class Receipt:
    """A tool's evidence that an effect committed.

    ``receipt_id`` names the effect in the tool's own terms (a resource id, a commit
    sha, a content hash); ``result`` (JSON) is what the workflow gets back; a tool that
    stores the intent digest beside the effect returns it so crashproof can detect a
    key reused with another intent. An approved act's receipt may say when the effect
    committed and which approval the target bound to it (``committed_at``,
    ``approval_digest``): committed after the approval expired, it goes to review.
    """

    receipt_id: str
    result: Any = None
    intent_digest: str | None = None
    # The target's own record of the effect, when it keeps one: when it committed (epoch
    # seconds, the target's clock) and the approval digest it bound to it.
    committed_at: float | None = None
    approval_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """What a tool sees of its environment, recorded with each act and compared on resume.

    ``instance`` names *which* environment (a workspace path, a repository, a forge's
    repository id): another instance on resume is never acted on. ``fingerprint`` names
    its *state* (a tree hash, a HEAD commit): a different state is a changed world.
    ``version`` (of the target, if it exposes one) and ``details`` (JSON) are evidence
    shown to the reviewer, never compared.
    """

    instance: str
    fingerprint: str
    version: str | None = None
    details: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.instance, str) or not self.instance:
            raise ValueError("Observation.instance must be a non-empty string")
        if not isinstance(self.fingerprint, str):
            raise ValueError("Observation.fingerprint must be a string")

    def to_json(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "fingerprint": self.fingerprint,
            "version": self.version,
            "details": self.details,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Observation:
        return cls(
            instance=str(data["instance"]),
            fingerprint=str(data["fingerprint"]),
            version=data.get("version"),
            details=data.get("details"),
        )


class Tool:
    """Base class for tools. Subclasses set ``name``/``version`` and implement
    ``execute`` and, when they can, ``lookup``.

    Capabilities, declared as class attributes:

    - ``supports_lookup``: ``lookup`` can tell whether an operation id was done. Without
      it, an act left in flight by a crash is settled as ``on_unknown`` says.
    - ``on_unknown`` (``cp.OnUnknown``): what an unknown outcome means when nothing can
      look it up: ``review`` (freeze for a person; the default), ``at_least_once`` (send
      again, same operation id) or ``at_most_once`` (recorded as not done). An instance
      may set its own. Journaled with each intent: a resume keeps the recorded meaning.
    - ``idempotent_execute``: executing twice with one operation id has one effect (the
      target dedupes by key), so re-executing after a crash is safe.
    - ``honours_fencing``: the target rejects calls carrying a fencing token lower than
      the highest it has seen.
    - ``matches_intent``: the target finds an operation id only together with the intent
      it was done with (a state-addressed target: the file holds exactly the intended
      bytes). Without it, a receipt that ``lookup`` returns, or that ``execute`` returns
      for an ``idempotent_execute`` tool (a deduping target may replay another caller's
      stored answer), must carry the intent digest the target stored with the operation
      id: one that carries none proves nothing (another caller may have used the key)
      and the act freezes for review.
    - ``deferred``: an outbox; see ``crashproof.tools.outbox``.
    - ``idempotency_window``: how long the target remembers an operation id (None:
      forever, or unknown). An act left in flight whose first intent is older than this,
      and that ``lookup`` does not find, is not executed again: the target may have
      forgotten the key, so the run freezes for review (runtime/steps/windows.py).
    """

    name: ClassVar[str] = "tool"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = False
    honours_fencing: ClassVar[bool] = False
    matches_intent: ClassVar[bool] = False
    idempotency_window: ClassVar[timedelta | None] = None
    # Not a ClassVar: a wrapper (a framework integration's tool) sets it per instance.
    on_unknown: OnUnknown = OnUnknown.REVIEW
    # Every resume looks completed acts up again before its first live call, and freezes
    # the run when a receipt is gone or changed (the tool's copy is the authority). False
    # skips that for this tool (a costly lookup, a target that forgets old keys): a
    # deleted or changed effect then replays as success from the journal's copy.
    reread_receipts: ClassVar[bool] = True
    # Other callers can reach this target (a shared API, not a private workspace): an
    # approved act's receipt must carry the approval digest the target bound to the
    # effect, or the act goes to review instead of being reconciled automatically.
    shared: ClassVar[bool] = False
    # An outbox: the params are journaled as the step's result and ``execute`` delivers
    # them after that commit, at least once, keyed by operation id (tools/outbox.py).
    deferred: ClassVar[bool] = False
    # Older contract versions this tool can map: {"1": fn(old_params) -> new_params}.
    # A changed contract still freezes an in-flight act (never a silent re-run); the
    # mapping tells a review and `crashproof replay` whether the change is exactly this.
    contract_mappings: ClassVar[Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {}

    def prepare(self, call: Call) -> dict[str, Any] | None:
        """Optional: compute what must be journaled with the intent (JSON), before it is
        committed. It comes back as ``call.prepared`` in execute and lookup, on every
        attempt and after any crash.

        Nothing was sent yet, so what it raises says what the act is: ``cp.PermanentError``
        refuses the intent (recorded as the act's failure, replayed as such);
        ``cp.Unavailable`` says the environment the tool needs is out, a service or the
        machine under its own bookkeeping (a store on a full or read-only disk, an I/O
        error, a file where its directory goes): nothing is journaled and the run stops
        resumable (``unavailable:<key>``), never failed; ``cp.ResourceBusy`` freezes it
        for a later resume. Anything else reaches the workflow as the act's error (left
        uncaught, the run fails). The runtime does not read an ``OSError`` as the
        machine's on its own: the same errno is often the act's own argument's (a
        ``cp.Workspace`` path naming a directory), which a resume would only meet again;
        the tool knows which of its calls touch its bookkeeping (``cp.Shell``'s snapshot
        store does so)."""
        return None

    def target_of(self, call: Call) -> str | None:
        """Optional: what this act changes (e.g. a file path), for tools whose later acts
        overwrite earlier ones; reconciliation then checks only the last act per target
        and tool name. Name the instance too when several of one name may act in a run
        (a ``cp.Workspace``: the file's absolute path, not its path in the root)."""
        return None

    def overwrites(self, call: Call, result: Any, tool: Tool, earlier: Call) -> bool:
        """Optional: whether this act changed the target of ``earlier``, an earlier act of
        another ``tool`` (what its ``target_of`` names), as this act's own record shows;
        ``result`` is this act's recorded result, None while it is in flight.
        Reconciliation then reports the earlier act superseded rather than drifted."""
        return False

    def execute(self, call: Call) -> Receipt:
        """Do the effect once for ``call.operation_id``. Raise ``cp.RetryableError`` or
        ``cp.PermanentError`` only when certain it did not happen; anything else
        (timeouts, dropped connections, a store that failed once the effect may have
        begun) is treated as an unknown outcome, which ``lookup`` settles. A failure of
        the machine before anything was sent is ``cp.Unavailable`` (retried, then a
        resumable stop), never ``PermanentError``: it is not the act's answer. Like
        ``RetryableError`` it declares this attempt not done: the next one (in the drive,
        or on a resume after the stop that records it) is sent without a lookup."""
        raise NotImplementedError(f"tool {self.name!r} does not implement execute")

    def lookup(self, call: Call) -> Receipt | None:
        """The receipt for ``call.operation_id`` if the effect happened, None if it
        definitely did not; raise ``cp.OutcomeUnknown`` when it cannot tell."""
        raise NotImplementedError(f"tool {self.name!r} does not implement lookup")

    def observe(self) -> Observation | None:
        """Optional: which environment this tool acts on, and its state now. The runtime
        records it with each act's intent (and after the receipt), and on resume compares
        it before anything executes. None: the tool cannot observe (nothing is checked)."""
        return None

    def observed_instance(self) -> str | None:
        """Optional: the instance ``observe`` names (``Observation.instance``), told
        without observing the state (cheap: no walk, no request). Reconciliation gives
        each recorded act the tool of its name whose instance is the one the act
        recorded, so several tools of one name (two ``cp.Workspace`` roots) each check
        their own acts. None: not known; the tool then matches by name alone."""
        return None

    def expect(self, call: Call, before: Observation) -> str | None:
        """Optional: the fingerprint the environment will have once this (prepared) act
        has applied, given ``before``; None when the tool cannot tell (on resume, the
        pending act's lookup then decides alone)."""
        return None
