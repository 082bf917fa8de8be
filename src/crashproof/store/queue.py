"""The queue side of a store: claiming the next runnable run, and reading leases.

A runnable run is one whose status is ``running`` and that nobody holds: it was enqueued
and never claimed, its driver released it (drained or hit an error), or its driver's
lease expired (the worker died or stalled). A claim takes the oldest such run of the
workflow versions the worker can drive, in one transaction, and bumps its fencing
token exactly as ``Store.claim`` does; two workers never claim the same run at once.
Expiry is judged by the store's clock (PostgreSQL: the server's ``clock_timestamp()``).

Every shipped store (memory, SQLite, PostgreSQL) implements this protocol beside the
``Store`` port; ``queue_store`` checks that a given store does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from crashproof.errors import LedgerError
from crashproof.store.port import Lease

__all__ = ["Claimed", "LeaseInfo", "QueueStore", "queue_store", "runnable_key"]

_SEPARATOR = "\x1f"  # ASCII unit separator: cannot appear in a name a user types


def runnable_key(workflow: str, version: str) -> str:
    """How a claim names one workflow version it can drive (matched against the run
    index's ``workflow`` and ``version`` columns)."""
    return f"{workflow}{_SEPARATOR}{version}"


def runnable_keys(versions: Iterable[tuple[str, str]]) -> list[str]:
    return sorted({runnable_key(name, version) for name, version in versions})


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run claimed from the queue: its id, the new lease, and who held it before
    (None: nobody; else a worker whose lease had expired)."""

    run_id: str
    lease: Lease
    previous_owner: str | None


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A run's lease as stored: owner (None: nobody), expiry (epoch seconds by the
    store's clock), fencing token."""

    owner: str | None
    expires_at: float | None
    token: int


@runtime_checkable
class QueueStore(Protocol):
    def claim_next(
        self,
        owner: str,
        ttl_seconds: float,
        runnable: Sequence[str],
        *,
        exclude: Sequence[str] = (),
    ) -> Claimed | None:
        """Claim the oldest runnable run whose ``runnable_key(workflow, version)`` is in
        ``runnable`` and whose id is not in ``exclude``; None when there is none. Locked
        rows are skipped, never waited for."""
        ...

    def leases(self) -> dict[str, LeaseInfo]:
        """The lease of every run, by run id (runs never claimed have owner None)."""
        ...


def queue_store(store: object) -> QueueStore:
    """``store`` as a QueueStore, or a clear error for a store without a queue."""
    if not isinstance(store, QueueStore):
        raise LedgerError(
            f"the store {type(store).__name__} cannot serve as a work queue (it has no "
            "claim_next/leases); use a sqlite:///, postgresql:// or memory:// ledger"
        )
    return store
