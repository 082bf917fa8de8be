"""The two seams of the runtime, as narrow Protocols (Temporal's ``workflow/_context.py``
``_Runtime`` is the model): the shells on top implement them, the parts below use them.

- :class:`RunSession`: what the recorders (``runtime/steps``) and the guards
  (``runtime/guards``) may use of a run in progress. ``Context`` implements it; an async
  shell implements the same port, so both drive the same recorders and guards.
- :class:`DriveHost`: what ``Context`` and the ledger's operations (``runtime/operations``,
  ``runtime/driving``) may use of the ``Ledger``. ``Ledger`` implements it.

Nothing here imports a module of ``runtime``; every module below ``context`` and ``ledger``
takes one of these ports, never the concrete class, and reads no private name of another
module. ``tests/unit/test_layers.py`` pins that direction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from crashproof._faults import CrashPoints
from crashproof.errors import CrashproofError, NonDeterminismError
from crashproof.integrity.witness import Witness
from crashproof.journal.records import Event, EventType, RunStatus, StepKind
from crashproof.store.port import RecordAppend, StatusChange, Store

# A record an async drive made and has not committed yet: its events, status change,
# fencing token, and whether it is an output point (None: output_point decides).
PendingRecord = tuple[Sequence[Event], StatusChange | None, int | None, bool | None]


__all__ = [
    "ActSettings",
    "DriveHost",
    "PendingRecord",
    "RunSession",
    "StepSession",
    "WrittenBatch",
]


@dataclass
class WrittenBatch:
    """A batch committed and not yet concluded (``JournalCommits.write_batch``): per
    group its result and the records kept; ``ticket``: what ``wait_durable`` waits for,
    when an output point among them is not on disk yet (None: nothing to wait for)."""

    results: list[tuple[int, Exception] | None]
    landed: list[tuple[RecordAppend, ...]]
    ticket: object | None

    def waits(self, group: int) -> bool:
        """Whether the group kept an output point, so it waits for ``ticket``'s sync."""
        return self.ticket is not None and any(r[3] for r in self.landed[group])


_MAX_SKEW = 86400.0  # a day: a larger "skew" is a misconfiguration, not a clock


def _seconds(name: str, value: float | None) -> float | None:
    """``value`` as seconds of a clock setting, or ValueError (one line, nothing kept)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= _MAX_SKEW:
        raise ValueError(
            f"{name} must be a number of seconds from 0 to {_MAX_SKEW:.0f} (a day), not {value!r}"
        )
    return float(value)


class ActSettings:
    """Bounds of the act protocol (per ledger): how often a retryable failure and a lookup
    are tried, the backoff between tries, how many receipts a resume re-reads at once,
    and how far the ledger's clocks may disagree.

    ``max_clock_skew`` (seconds, default 5): an approval that expires within it of the
    ledger's clock counts as expired (runtime/steps/clock.py). ``window_margin`` (seconds,
    default ``max_clock_skew``): an act's intent counts that much older against its
    tool's idempotency window when the target's clock is not known (steps/windows.py)."""

    def __init__(
        self,
        *,
        retryable_attempts: int = 3,
        lookup_attempts: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        reread_workers: int = 8,
        max_clock_skew: float = 5.0,
        window_margin: float | None = None,
    ) -> None:
        skew = _seconds("max_clock_skew", max_clock_skew)
        self.max_clock_skew = 5.0 if skew is None else skew
        margin = _seconds("window_margin", window_margin)
        self.window_margin = self.max_clock_skew if margin is None else margin
        self.retryable_attempts = retryable_attempts
        # Completed acts whose receipts a resume looks up again at once (threads).
        self.reread_workers = reread_workers
        self.lookup_attempts = lookup_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff

    def delay(self, attempt: int) -> float:
        return float(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))


class RunSession(Protocol):
    """A run being driven: its identity and lease, its journal, and how it stops.

    Every append is one commit under the run's fencing token (a lost lease raises
    ``StaleLeaseError`` and keeps nothing)."""

    @property
    def run_id(self) -> str: ...

    @property
    def fencing_token(self) -> int | None:
        """The lease the run is driven under (None: an operator's write, no lease)."""

    @property
    def act_settings(self) -> ActSettings: ...

    @property
    def frozen(self) -> CrashproofError | None:
        """Why this drive stopped (a freeze, a budget, an abort), or None."""

    @property
    def next_seq(self) -> int:
        """The sequence number the run's next record gets."""

    @property
    def versions(self) -> dict[str, str | None]:
        """The versions this drive runs under: ``{"workflow": ..., "policy": ...}``."""

    def ledger_now(self) -> float:
        """The ledger's clock (``Store.now``: the server's on PostgreSQL, a monotonic
        host clock on SQLite): what approvals' expiries and idempotency windows are
        checked against, never the host's clock alone."""

    @property
    def server_clock(self) -> bool:
        """Whether ``ledger_now`` reads one server's clock (PostgreSQL): times it gave
        may be subtracted without a margin for two hosts' clocks."""

    def journal(self, run_id: str | None = None) -> list[Event]:
        """A verified journal of this ledger: this run's (default), or another's (the
        approvers registry)."""

    def append_event(
        self,
        type_: EventType,
        key: str | None,
        payload: dict[str, Any],
        value_json: str | None = None,
        *,
        status: tuple[RunStatus, str | None] | None = None,
    ) -> None:
        """Append one record (and change the run's status with it)."""

    def freeze(
        self,
        reason: str,
        evidence: dict[str, Any],
        *,
        key: str | None = None,
        retryable: bool = False,
        error: type[CrashproofError] = NonDeterminismError,
    ) -> NoReturn:
        """Journal a ``needs_review`` freeze with evidence and raise ``error``."""

    def store_failed(self, cause: BaseException) -> NoReturn:
        """The ledger itself failed (``cause``: a commit whose outcome is unknown, a
        read): the drive stops, writing nothing more, and ``cause`` is never a call's
        outcome (DESIGN.md §11 invariant 8). Raises a BaseException (``StoreFailed``)."""

    def halt(self, exc: CrashproofError, evidence: dict[str, Any] | None = None) -> None:
        """Nothing more runs in this drive: ``exc`` (already journaled by the caller: a
        budget stop, an approval request, an abort) is what the ledger raises, whatever
        the workflow catches."""

    def finish(self, type_: EventType, payload: dict[str, Any], value_json: str | None) -> None:
        """Record the run's outcome (succeeded or failed)."""

    def crash_point_for(self, key: str) -> Callable[[str], None]:
        """A crash-point hook for a tool working on act ``key`` (free when unarmed)."""

    @property
    def call_scopes(self) -> tuple[Any, ...]:
        """The observers' scopes entered around each live call's body, and around an
        act's ``execute`` and ``lookup`` (``runtime/steps/scopes.py``; ``Ledger.on_call``)."""


class StepSession(RunSession, Protocol):
    """What ``runtime/steps/live.py`` needs beyond ``RunSession`` to run a step live:
    the failed attempts the journal holds for it, the bracket around its body (a ctx call
    inside it is a misuse), and the fast record of its success."""

    def earlier_attempts(self, key: str) -> list[Event] | None:
        """The journaled failed attempts of ``key`` (a retry in progress), or None."""

    def enter_step(self, key: str) -> None:
        """The body of ``key`` runs now: a ctx call before ``leave_step`` is refused."""

    def leave_step(self) -> bool:
        """The body returned or raised; True when a ctx call was attempted inside it."""

    def record_done(
        self,
        kind: StepKind,
        key: str,
        digest: str,
        attempt: int,
        took_us: int,
        spent: dict[str, Any] | None,
        ended: float,
        value_json: str,
    ) -> None:
        """Record the successful outcome of ``key`` (``spent``: a decision's model, usage
        and cost)."""


class DriveHost(Protocol):
    """The ledger under a drive: its store and witness, its identity, verified journal
    reads and fenced commits. ``Context`` and the ledger's mixins and operations use
    these, never the ``Ledger`` class."""

    url: str
    shown_url: str  # the URL without its password: what messages and logs may show
    worker_id: str
    lease_seconds: float
    durability: str
    act_settings: ActSettings
    store_requests: bool  # a decision's request is stored (a delta) for people to read
    crash_points: CrashPoints | None
    draining: bool  # set by a worker that stops: its runs stop at their next step
    call_scopes: tuple[Any, ...]  # entered around each live call (steps/scopes.py)

    @property
    def store(self) -> Store: ...

    @property
    def witness(self) -> Witness | None: ...

    def journal(self, run_id: str, *, owner: bool = False, results: bool = True) -> list[Event]:
        """The run's journal, every MAC, the chain and its witnessed generation verified.
        ``owner``: the caller is about to drive the run (a journal ahead of its witness
        rolls the witness forward; a moved run is refused). ``results=False``: without
        the steps' results (what a reader's fold needs, in a long run's memory)."""

    def append_records(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        *,
        fencing_token: int | None = None,
        output: bool | None = None,
    ) -> None:
        """Commit ``events`` to their run's journal, durable first at an output point
        (``runtime/driving/durability.py``); ``fencing_token`` is checked in the commit's
        transaction. ``output``: whether the last record is an output point, when the
        caller knows."""

    def commit_batch(
        self, groups: Sequence[Sequence[PendingRecord]]
    ) -> list[tuple[int, Exception] | None]:
        """Commit async drives' pending records, a group per drive in order
        (``runtime/driving/commits.py``); per group None, or (index, error) of the first
        record not kept."""

    def write_batch(self, groups: Sequence[Sequence[PendingRecord]]) -> WrittenBatch:
        """``commit_batch``'s transaction alone; then ``wait_durable`` for the groups
        that wait, and ``conclude_batch`` (``runtime/driving/commits.py``)."""

    def wait_durable(self, batches: Sequence[WrittenBatch]) -> None:
        """Returns once the output points the ``batches`` kept (written in this order) are
        on disk and witnessed: one sync and one witness write for all of them."""

    def conclude_batch(self, written: WrittenBatch, groups: Iterable[int]) -> None:
        """The ``groups``' crash points after their commit, the witness, the observers."""

    def check_driving(self, run_id: str) -> None:
        """Called before every step: raises when this ledger stops driving ``run_id``
        (a worker draining)."""
