"""The storage port: the few operations the runtime needs from a durable store.

Every method is atomic on its own. Domain logic (replay, folding, policy) lives
above this port; a store only keeps runs and their append-only journals.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from crashproof.errors import IntegrityError, LeaseHeld, LedgerError, StaleLeaseError
from crashproof.journal.records import EVENT_TYPES, Event, RunRow, RunStatus
from crashproof.store.intents import IntentHold

__all__ = [
    "BLOB_THRESHOLD",
    "blob_digest",
    "without_result",
    "check_append",
    "check_claimable",
    "GENESIS",
    "Lease",
    "RecordAppend",
    "RecordSealer",
    "StatusChange",
    "Store",
    "LedgerClock",
    "lease_held",
    "lease_was_live",
    "unencodable",
    "unreadable",
    "VERSION_FRESH",
]

# Values at least this long (in bytes of JSON) are stored once, content-addressed. Shorter
# ones stay in their record's row: a model's ~1 KB reply kept apart took a 4 KB overflow
# page of its own in SQLite (5.1 KB on disk per turn of a transcript, 1.4 KB inline;
# docs/benchmarks.md), and a value this short rarely recurs whole.
BLOB_THRESHOLD = 8192
# Seconds a store's schema version, once read, answers ``schema_version()``: every drive
# names the version in its session, and an async loop starts runs by the thousand; a read
# in the last second is as current as one now (a migration by another process may land
# right after either read). On SQLite each read is a read transaction of its own (7% of
# the loop at R=1,024 in bench/concurrency.py); on PostgreSQL a round trip.
VERSION_FRESH = 1.0


def without_result(
    run_id: str,
    seq: int,
    type_: str,
    key: str | None,
    payload_json: str,
    created_at: float,
    value_json: str | None,
) -> Event:
    """``Event.read`` without a step's result (``load_events(results=False)``)."""
    value = None if type_ == "step_done" else value_json
    return Event.read(run_id, seq, type_, key, payload_json, created_at, value)


def blob_digest(value: str | None) -> str | None:
    """The content address under which a stored value is kept apart, once (a SHA-256 of
    its UTF-8 text), or None when it is short enough to stay inline."""
    if value is None or len(value) < BLOB_THRESHOLD:
        return None
    return hashlib.sha256(value.encode()).hexdigest()


StatusChange = tuple[RunStatus, str | None]

# One record of a batch commit (a store's optional ``append_batch``): its events, status
# change, fencing token, and whether it is an output point (durable before returning).
RecordAppend = tuple[Sequence[Event], StatusChange | None, int | None, bool]

GENESIS = ""  # the "previous MAC" of a run's first record


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's claim on a run: who, with which fencing token, until when (epoch
    seconds by the store's clock), renewed for ``ttl_seconds`` at a time. A claim also
    says what it replaced, read in its own transaction: ``previous_owner`` (None: nobody
    held the run) and ``previous_live`` (that holder's lease had not expired: taken over).
    The previous token is ``token - 1``: every claim adds one."""

    owner: str
    token: int
    expires_at: float
    ttl_seconds: float
    previous_owner: str | None = None
    previous_live: bool = False


def lease_was_live(held_by: str | None, expires_at: float | None, now: float, owner: str) -> bool:
    """Whether a claim by ``owner`` at ``now`` takes a live lease of another holder."""
    return held_by is not None and held_by != owner and expires_at is not None and expires_at > now


def check_claimable(
    run_id: str,
    held_by: str | None,
    expires_at: float | None,
    now: float,
    owner: str,
    take_over: bool | str,
) -> None:
    """The claim rule every store applies: a run with no owner, an expired lease, the
    same owner again, or a take-over may be claimed; else LeaseHeld. ``take_over``: True
    fences out whoever holds the lease; an owner id fences out only that holder (one
    found gone), so of two claimants taking over from a dead holder one wins."""
    if (
        held_by is not None
        and expires_at is not None
        and expires_at > now
        and held_by != owner
        and take_over is not True
        and held_by != take_over
    ):
        raise lease_held(run_id, held_by, expires_at)


_End = TypeVar("_End", bound=tuple[Any, ...])
_Built = TypeVar("_Built")


def check_append(
    run_id: str,
    where: str,
    end: _End | None,
    fencing_token: int | None,
    events: Sequence[Event],
) -> _End:
    """The append rule every store applies, against the journal's end as read in the
    append's transaction, ``end`` = (next seq, last MAC, the run's fencing token, and
    whatever else the store keeps there), None when the run does not exist: the
    writer's lease must be current and ``events`` must continue the journal exactly.
    (The primary key only refuses a taken seq; a gap, a reorder or a missing run would
    slip through it.) Else StaleLeaseError; returns ``end``, known to exist."""
    if end is None:
        if fencing_token is not None:  # leased, then gone: lost in a database crash
            raise LedgerError(
                f"run {run_id!r} is no longer in ledger {where}, though this drive holds "
                "its lease: the ledger lost commits it had acknowledged (a database crash?). "
                "Nothing of this write was kept; start or resume the run again."
            )
        raise StaleLeaseError(f"run {run_id!r} does not exist in ledger {where}")
    if fencing_token is not None and fencing_token != end[2]:
        raise StaleLeaseError(
            f"run {run_id!r} was taken over (fencing token {fencing_token} is "
            f"superseded by {end[2]}); nothing of this write was kept"
        )
    for offset, event in enumerate(events):
        if event.run_id != run_id or event.seq != end[0] + offset:
            if fencing_token is not None and event.run_id == run_id:
                # Under the current lease no one else wrote: the journal is not what the
                # drive's commits left (a database crash lost commits it had
                # acknowledged unsynced, or kept one it reported failed). The ledger's
                # failure, not a takeover: the drive stops, a resume reads what is there.
                raise LedgerError(
                    f"run {run_id!r}: the journal ends at sequence {end[0]}, not where this "
                    f"drive's commits left it ({event.seq}), though the run's lease is still "
                    "this drive's: the ledger lost or kept commits it had not confirmed (a "
                    "database crash?). Nothing of this write was kept; resume the run from "
                    "what is durable."
                )
            raise StaleLeaseError(
                f"run {run_id!r}: journal sequence {event.seq} is already taken or out "
                "of order; another writer is appending to this run. Nothing of this "
                "write was kept."
            )
    return end


def seq_taken(first: Event) -> StaleLeaseError:
    """The error an append meets when its first record's seq is already in the journal
    (the store's primary key refused it)."""
    return StaleLeaseError(
        f"run {first.run_id!r}: journal sequence {first.seq} is already taken; "
        "another writer is appending to this run. Nothing of this write was kept."
    )


def unencodable(where: str, exc: UnicodeEncodeError) -> str:
    """What a store says of a text it cannot write as UTF-8 (a lone surrogate: a file name
    decoded with ``surrogateescape``, say), which no database text can hold."""
    shown = exc.object[exc.start : exc.end] if isinstance(exc.object, str) else ""
    return (
        f"{where} refused a value: it holds {shown!r}, a lone surrogate, which has no "
        "UTF-8 and which no database text can hold; run ids, workflow names and step "
        "names must be UTF-8 text. Nothing of this write was kept"
    )


def lease_held(run_id: str, owner: str, expires_at: float) -> LeaseHeld:
    """The error a claim meets when another worker's lease on the run is still valid."""
    try:
        until = dt.datetime.fromtimestamp(expires_at, tz=dt.UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):  # a lease column edited past any calendar
        until = f"{expires_at!r} (not a date: the file was edited?)"
    return LeaseHeld(
        f"run {run_id!r} is owned by worker {owner} until {until}; nothing was changed. "
        "Wait for its lease to expire, or take it over (resume --take-over), which fences "
        "the old owner out.",
        owner=owner,
        expires_at=expires_at,
    )


def unreadable(run_id: str, rows: Iterable[Sequence[Any]]) -> IntegrityError:
    """The error naming the record of an unknown type among a run's loaded ``rows``
    (each beginning with seq, type)."""
    for seq, type_, *_ in rows:
        if type_ not in EVENT_TYPES:
            return IntegrityError(
                f"run {run_id!r} event {seq} is unreadable: unknown type {type_!r}"
            )
    return IntegrityError(f"run {run_id!r}: its journal is unreadable")


class RecordSealer(Protocol):
    """What a store needs to seal records with an HMAC chain and check them on read
    (crashproof.integrity.seal.Sealer). Stores see only this port, never the keys."""

    def seal(
        self,
        run_id: str,
        seq: int,
        type_: str,
        key: str | None,
        payload: str,
        value: str | None,
        created_at: float,
        prev_mac: str,
    ) -> tuple[str, str]:
        """(key id, MAC) over exactly the bytes to be stored, chained to ``prev_mac``."""
        ...

    def verify(
        self,
        run_id: str,
        seq: int,
        type_: str,
        key: str | None,
        payload: str,
        value: str | None,
        created_at: float,
        prev_mac: str,
        key_id: str | None,
        mac: str | None,
    ) -> None:
        """Raise (an IntegrityError) unless the record is exactly what was sealed."""
        ...

    def verify_chain(self, run_id: str, records: Iterable[Sequence[Any]], prev_mac: str) -> str:
        """``verify`` each record, in order, chained from ``prev_mac``; the last MAC.
        Records start with (seq, type, key, payload, value, created_at, key_id, mac)."""
        ...

    def verify_rows(
        self, run_id: str, records: Iterable[Sequence[Any]], make: Callable[..., _Built]
    ) -> list[_Built]:
        """``verify_chain`` from the run's first record; ``make(run_id, seq, type, key,
        payload, created_at, value)`` of each record, built as soon as it verified."""
        ...

    def verify_rows_from(
        self,
        run_id: str,
        records: Iterable[Sequence[Any]],
        make: Callable[..., _Built],
        prev_mac: str,
    ) -> tuple[list[_Built], str]:
        """``verify_rows`` of records chained from ``prev_mac``, and the last MAC."""
        ...


class LedgerClock:
    """A host clock made monotonic: never behind an earlier reading, nor behind a
    ``floor`` the ledger gives (the newest time it has recorded). ``clock``: the host's
    wall clock, ``time.time`` unless a test skews it (``Ledger(clock=...)``)."""

    def __init__(self, clock: Callable[[], float], *, server: bool = False) -> None:
        self.clock = clock
        self.is_server = server  # Store.now reads a server's clock (PostgreSQL), not a host's
        self._high = float("-inf")
        self._lock = threading.Lock()

    def read(self, floor: float | None = None) -> float:
        """The host's clock, never behind ``floor`` nor an earlier reading."""
        return self.server(max(float(self.clock()), floor if floor is not None else float("-inf")))

    def server(self, now: float) -> float:
        """A server's clock reading ``now`` (the host's clock not consulted), never behind
        an earlier reading."""
        with self._lock:
            self._high = max(self._high, now)
            return self._high


class Store(Protocol):
    """A durable home for runs and their journals."""

    clock: LedgerClock

    def now(self) -> float:
        """The ledger's clock (epoch seconds): what an approval's expiry and the age of
        an act's intent are checked against (runtime/steps/clock.py). PostgreSQL: the
        server's clock (``clock_timestamp()``), whatever the hosts' clocks say. SQLite
        and memory: this host's clock, but never behind an earlier reading nor the
        newest time the ledger holds (a run's last status change, an unresolved act
        intent), so a host whose clock runs behind cannot take the ledger back before
        what another host has recorded."""
        ...

    def schema_version(self) -> int:
        """The schema version this store was written with."""
        ...

    def create_run(self, row: RunRow, first: Event, lease: Lease | None = None) -> RunRow | None:
        """Insert ``row`` and its first event atomically, unless the run exists.

        Returns None when created, else the existing row (nothing is written).
        ``lease``: the new run is created held under it, as its first claim would leave
        it (owner, expiry, fencing token 1): the drive that starts a run saves a claim.
        """
        ...

    def get_run(self, run_id: str) -> RunRow | None:
        """The run's index row, or None."""
        ...

    def list_runs(self, status: RunStatus | None = None) -> list[RunRow]:
        """Index rows, oldest first, optionally of one status."""
        ...

    def load_events(self, run_id: str, *, results: bool = True) -> list[Event]:
        """The run's whole journal in sequence order, in one read. ``results=False``: a
        ``step_done`` record's value (a step's result) is dropped once its MAC is
        verified (``without_result``), for readers that fold steps without their
        results: the memory of a long run's journal is then its payloads'."""
        ...

    def load_requests(self, run_id: str) -> dict[int, str]:
        """The request texts kept beside the run's records, by record seq (a
        ``KeptRequest``'s ``request_text``): for display only, never read by a replay.
        Each is checked by its reader against the digest its MAC-covered record holds."""
        ...

    def append(
        self,
        events: Sequence[Event],
        status: StatusChange | None = None,
        *,
        fencing_token: int | None = None,
        durable: bool = False,
    ) -> None:
        """Append events of one run (consecutive seqs) and optionally change its status,
        in one transaction. A record's ``request_text`` (a ``KeptRequest``) is written
        beside it in the same transaction (``load_requests``). Raises StaleLeaseError if
        any seq is already taken: someone else wrote to this run, and nothing of this
        call is kept.
        ``fencing_token``: the same transaction checks that it is still the run's
        current token (else StaleLeaseError, nothing kept). ``durable``: in "output"
        durability, return only once this commit and every earlier one would survive a
        power cut (the runtime asks for it right before something leaves the process).
        The same transaction keeps the index of unresolved act intents
        (store/intents.py) and raises IntentHeld, nothing kept, when an ``act_intent``
        would open a hold another run has on the same intent. A change to a terminal
        status (succeeded, failed, cancelled) also releases the run's lease in the same
        transaction, as ``release`` would: the drive that ended the run saves a commit,
        and the fencing token is kept."""
        ...

    def unresolved_intents(self, run_id: str | None = None) -> list[IntentHold]:
        """The index of unresolved act intents (of one run, or of all), oldest first."""
        ...

    def sync(self) -> None:
        """Make every commit so far durable (in "output" durability; a no-op where every
        commit is synced anyway, or never forced). Concurrent callers share one sync."""
        ...

    def claim(
        self, run_id: str, owner: str, ttl_seconds: float, *, take_over: bool | str = False
    ) -> Lease:
        """Take the run's lease: a compare-and-set that succeeds when the run has no
        owner, its owner's lease expired, ``owner`` already holds it, or ``take_over``
        is True or names the current holder; sets owner and expiry and increments the
        run's fencing token. Otherwise raises LeaseHeld (owner, until when); RunNotFound
        for an unknown run. Not a journal record."""
        ...

    def renew(self, run_id: str, lease: Lease) -> Lease:
        """Extend the lease by its ttl while it is still the run's current one (same
        owner and token), else StaleLeaseError."""
        ...

    def release(self, run_id: str, lease: Lease) -> None:
        """Clear the run's owner if ``lease`` is still the current one; idempotent. The
        fencing token is kept (it never goes down)."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...
