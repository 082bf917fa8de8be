"""The queue side of a store: claiming the next runnable run, and reading leases.

A runnable run is one that nobody holds and that needs a driver:

- its status is ``running``: it was enqueued and never claimed, its driver released it
  (drained or hit an error, e.g. the store itself was out), or its driver's lease
  expired (the worker died or stalled);
- or it stopped for a retryable cause (``retryable_stop``: status ``stopped``, reason
  ``unavailable:...``, a model, tool or lookup that was out, or an act waiting for
  another run's unresolved act on its intent: runtime/steps/holds.py) and its
  ``retry_at`` has passed (NULL: at once). Its claim counts one more automatic attempt
  (``retries``); the worker whose attempt stops again schedules the next one
  (``schedule_retry``), so every worker agrees on it and ``crashproof runs`` shows it.
  A run frozen for a person (``needs_review``, ``awaiting_approval``) or stopped for any
  other reason (a budget) is never runnable.

A claim takes the oldest such run of the workflow versions the worker can drive, in one
transaction, and bumps its fencing token exactly as ``Store.claim`` does; two workers
never claim the same run at once. Expiry and retry times are judged by the store's
clock (PostgreSQL: the server's ``clock_timestamp()``).

Every shipped store (memory, SQLite, PostgreSQL) implements this protocol beside the
``Store`` port; ``queue_store`` checks that a given store does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from crashproof.errors import LedgerError
from crashproof.store.port import Lease

__all__ = [
    "RETRYABLE_PREFIX",
    "Claimed",
    "LeaseInfo",
    "QueueStore",
    "queue_store",
    "retryable_stop",
    "runnable_key",
]

_SEPARATOR = "\x1f"  # ASCII unit separator: cannot appear in a name a user types

# The stop reason of a retryable cause (runtime/steps/outage.py writes it); the claim
# queries (sql/*/queue.sql) match the same prefix.
RETRYABLE_PREFIX = "unavailable:"


def retryable_stop(status: str, reason: str | None) -> bool:
    """A run stopped for a cause a later attempt may clear (a service out): a worker
    resumes it on its own. Anything else that waits (a budget, a review) waits for a person."""
    return status == "stopped" and (reason or "").startswith(RETRYABLE_PREFIX)


def runnable_key(workflow: str, version: str) -> str:
    """How a claim names one workflow version it can drive (matched against the run
    index's ``workflow`` and ``version`` columns)."""
    return f"{workflow}{_SEPARATOR}{version}"


def runnable_keys(versions: Iterable[tuple[str, str]]) -> list[str]:
    return sorted({runnable_key(name, version) for name, version in versions})


@dataclass(frozen=True, slots=True)
class Claimed:
    """A run claimed from the queue: its id, the new lease, and who held it before
    (None: nobody; else a worker whose lease had expired). ``retry``: 0 for a running
    run; for a run stopped for a retryable cause, its automatic attempt number (1, 2, ...)."""

    run_id: str
    lease: Lease
    previous_owner: str | None
    retry: int = 0


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A run's lease as stored: owner (None: nobody), expiry (epoch seconds by the
    store's clock), fencing token; and its retry schedule: when a worker tries it next
    if it stopped for a retryable cause (None: at once), and the attempts made so far."""

    owner: str | None
    expires_at: float | None
    token: int
    retry_at: float | None = None
    retries: int = 0


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

    def schedule_retry(self, run_id: str, delay: float, retries: int) -> float | None:
        """Try the stopped run ``run_id`` again in ``delay`` seconds (the store's clock),
        after ``retries`` automatic attempts; the time, or None when the run is no longer
        stopped (another worker took it on, or it ended)."""
        ...

    def leases(self) -> dict[str, LeaseInfo]:
        """The lease of every run, by run id (runs never claimed have owner None)."""
        ...


def queue_store(store: object) -> QueueStore:
    """``store`` as a QueueStore, or a clear error for a store without a queue."""
    if not isinstance(store, QueueStore):
        raise LedgerError(
            f"the store {type(store).__name__} cannot serve as a work queue (it has no "
            "claim_next/schedule_retry/leases); use a sqlite:///, postgresql:// or "
            "memory:// ledger"
        )
    return store
