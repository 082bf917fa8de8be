"""An in-memory store: the fake shipped to users and the contract suite's reference."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from crashproof.errors import RunNotFound, StaleLeaseError
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.store.index import RESERVED_PREFIX, IndexQuery
from crashproof.store.intents import IntentHold, change_of, held, others
from crashproof.store.port import (
    Lease,
    LedgerClock,
    StatusChange,
    blob_digest,
    check_claimable,
    lease_was_live,
)
from crashproof.store.queue import Claimed, LeaseInfo, retryable_stop, runnable_key

__all__ = ["MemoryStore"]

SCHEMA_VERSION = 1


class MemoryStore:
    """Keeps everything in dicts; thread-safe; lost with the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunRow] = {}
        self._events: dict[str, list[Event]] = {}
        self.blobs: dict[str, str] = {}  # digest -> JSON text, shared by equal values
        self._requests: dict[str, dict[int, str]] = {}  # run id -> seq -> request text
        # run_id -> (owner, lease expiry by the local clock, fencing token)
        self._leases: dict[str, tuple[str | None, float | None, int]] = {}
        self._retries: dict[str, tuple[float | None, int]] = {}  # run id -> (retry_at, retries)
        # (run_id, step key) -> its unresolved act intent (store/intents.py)
        self._holds: dict[tuple[str, str], IntentHold] = {}
        self.clock = LedgerClock(time.time)

    def now(self) -> float:
        with self._lock:  # the newest time this ledger holds: its runs' last changes
            floor = max((r.updated_at for r in self._runs.values()), default=None)
            floor = max([h.since for h in self._holds.values()] + [floor or float("-inf")])
        return self.clock.read(floor)

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def create_run(self, row: RunRow, first: Event, lease: Lease | None = None) -> RunRow | None:
        with self._lock:
            existing = self._runs.get(row.run_id)
            if existing is not None:
                return existing
            self._runs[row.run_id] = row
            if lease is not None:
                self._leases[row.run_id] = (lease.owner, lease.expires_at, lease.token)
            self._events[row.run_id] = [self._keep(first)]
            return None

    def get_run(self, run_id: str) -> RunRow | None:
        with self._lock:
            return self._runs.get(run_id)

    def list_runs(self, status: RunStatus | None = None) -> list[RunRow]:
        with self._lock:
            rows = sorted(self._runs.values(), key=lambda r: (r.created_at, r.run_id))
        return [r for r in rows if status is None or r.status == status]

    def index_page(self, query: IndexQuery, offset: int, limit: int) -> tuple[list[RunRow], int]:
        with self._lock:
            rows = [r for r in self._runs.values() if query.matches(r)]
        rows.sort(key=lambda r: r.run_id)
        rows.sort(key=lambda r: r.updated_at, reverse=True)  # stable: run id breaks ties
        offset = max(0, offset)
        return rows[offset : offset + limit], len(rows)

    def index_summary(self) -> tuple[dict[str, int], list[str]]:
        with self._lock:
            rows = [r for r in self._runs.values() if IndexQuery().matches(r)]
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.status.value] = counts.get(row.status.value, 0) + 1
        return counts, sorted({row.workflow for row in rows})

    def index_marks(self) -> list[tuple[str, str, float]]:
        with self._lock:
            rows = [r for r in self._runs.values() if IndexQuery().matches(r)]
        return [(r.run_id, r.status.value, r.updated_at) for r in rows]

    def index_outbox_runs(self) -> set[str]:
        with self._lock:
            return {
                run_id
                for run_id, events in self._events.items()
                if not run_id.startswith(RESERVED_PREFIX)
                and any(e.type is EventType.STEP_DONE and e.mentions("outbox") for e in events)
            }

    def index_reconciled_runs(self) -> set[str]:
        with self._lock:
            return {
                run_id
                for run_id, events in self._events.items()
                if any(e.type is EventType.ACT_RECONCILED for e in events)
            }

    def load_events(self, run_id: str, *, results: bool = True) -> list[Event]:
        with self._lock:  # results: kept either way (they are in memory already)
            return list(self._events.get(run_id, ()))

    def load_requests(self, run_id: str) -> dict[int, str]:
        with self._lock:
            return dict(self._requests.get(run_id, {}))

    def append(
        self,
        events: Sequence[Event],
        status: StatusChange | None = None,
        *,
        fencing_token: int | None = None,
        durable: bool = False,  # nothing in memory survives a crash: nothing to force
    ) -> None:
        if not events:
            return
        run_id = events[0].run_id
        with self._lock:
            journal = self._events.get(run_id)
            row = self._runs.get(run_id)
            if journal is None or row is None:
                raise StaleLeaseError(f"run {run_id!r} does not exist in this store")
            current = self._leases.get(run_id, (None, None, 0))[2]
            if fencing_token is not None and fencing_token != current:
                raise StaleLeaseError(
                    f"run {run_id!r} was taken over (fencing token {fencing_token} is "
                    f"superseded by {current}); nothing of this write was kept"
                )
            for offset, event in enumerate(events):
                if event.run_id != run_id or event.seq != len(journal) + offset:
                    raise StaleLeaseError(
                        f"run {run_id!r}: sequence {event.seq} is already taken or out of "
                        "order; another writer is appending to this run"
                    )
            self._holds = self._held(run_id, events)
            journal.extend(self._keep(e) for e in events)
            if status is not None:
                self._runs[run_id] = RunRow(
                    run_id=row.run_id,
                    workflow=row.workflow,
                    version=row.version,
                    status=status[0],
                    input_digest=row.input_digest,
                    created_at=row.created_at,
                    updated_at=time.time(),
                    reason=status[1],
                )
                if status[0].terminal:  # the lease goes with the run's end (Store.append)
                    self._leases[run_id] = (None, None, current)

    def unresolved_intents(self, run_id: str | None = None) -> list[IntentHold]:
        with self._lock:
            holds = list(self._holds.values())
        return sorted(
            (h for h in holds if run_id is None or h.run_id == run_id),
            key=lambda h: (h.since, h.run_id, h.key),
        )

    def _held(self, run_id: str, events: Sequence[Event]) -> dict[tuple[str, str], IntentHold]:
        """The index once ``events`` are appended (IntentHeld: nothing changes)."""
        holds = self._holds
        for event in events:
            change = change_of(event)
            if change is None:
                continue
            if holds is self._holds:
                holds = dict(holds)  # copied at the first change: a refusal keeps nothing
            if change.what == "end":
                holds = {k: h for k, h in holds.items() if k[0] != run_id}
            elif change.what == "release":
                holds.pop((run_id, change.key), None)
            else:
                found = [
                    h
                    for k, h in holds.items()
                    if k == (run_id, change.key)
                    or (h.intent_digest, h.instance) == (change.digest, change.instance)
                ]
                refusing = others(found, run_id, change)
                if refusing:
                    raise held(run_id, change.key, refusing)
                if refusing is not None:
                    holds[(run_id, change.key)] = IntentHold(
                        run_id, change.key, change.digest, change.instance, change.since
                    )
        return holds

    def claim(
        self, run_id: str, owner: str, ttl_seconds: float, *, take_over: bool | str = False
    ) -> Lease:
        with self._lock:
            if run_id not in self._runs:
                raise RunNotFound(f"no run {run_id!r} in this store")
            held_by, expires_at, token = self._leases.get(run_id, (None, None, 0))
            now = time.time()
            check_claimable(run_id, held_by, expires_at, now, owner, take_over)
            live = lease_was_live(held_by, expires_at, now, owner)
            lease = Lease(owner, token + 1, now + ttl_seconds, ttl_seconds, held_by, live)
            self._leases[run_id] = (owner, lease.expires_at, lease.token)
            return lease

    def renew(self, run_id: str, lease: Lease) -> Lease:
        with self._lock:
            held_by, _, token = self._leases.get(run_id, (None, None, 0))
            if held_by != lease.owner or token != lease.token:
                raise StaleLeaseError(
                    f"run {run_id!r}: the lease of worker {lease.owner} (fencing token "
                    f"{lease.token}) is no longer current; another worker owns the run"
                )
            renewed = Lease(lease.owner, token, time.time() + lease.ttl_seconds, lease.ttl_seconds)
            self._leases[run_id] = (held_by, renewed.expires_at, token)
            return renewed

    def release(self, run_id: str, lease: Lease) -> None:
        with self._lock:
            held_by, _, token = self._leases.get(run_id, (None, None, 0))
            if held_by == lease.owner and token == lease.token:
                self._leases[run_id] = (None, None, token)

    # -- the work queue (crashproof.store.queue) ------------------------------

    def claim_next(
        self,
        owner: str,
        ttl_seconds: float,
        runnable: Sequence[str],
        *,
        exclude: Sequence[str] = (),
    ) -> Claimed | None:
        with self._lock:
            now = time.time()
            wanted, skipped = set(runnable), set(exclude)
            for row in sorted(self._runs.values(), key=lambda r: (r.created_at, r.run_id)):
                held_by, expires_at, token = self._leases.get(row.run_id, (None, None, 0))
                retry_at, retries = self._retries.get(row.run_id, (None, 0))
                stopped = retryable_stop(row.status.value, row.reason) and (
                    retry_at is None or retry_at <= now
                )
                if (
                    (row.status is RunStatus.RUNNING or stopped)
                    and (held_by is None or expires_at is None or expires_at <= now)
                    and runnable_key(row.workflow, row.version) in wanted
                    and row.run_id not in skipped
                ):
                    lease = Lease(owner, token + 1, now + ttl_seconds, ttl_seconds, held_by)
                    self._leases[row.run_id] = (owner, lease.expires_at, lease.token)
                    if stopped:  # one more automatic attempt
                        self._retries[row.run_id] = (retry_at, retries + 1)
                    return Claimed(row.run_id, lease, held_by, retries + 1 if stopped else 0)
            return None

    def schedule_retry(self, run_id: str, delay: float, retries: int) -> float | None:
        with self._lock:
            row = self._runs.get(run_id)
            if row is None or row.status is not RunStatus.STOPPED:
                return None
            at = time.time() + delay
            self._retries[run_id] = (at, retries)
            return at

    def leases(self) -> dict[str, LeaseInfo]:
        with self._lock:
            return {
                run_id: LeaseInfo(
                    *self._leases.get(run_id, (None, None, 0)),
                    *self._retries.get(run_id, (None, 0)),
                )
                for run_id in self._runs
            }

    def _keep(self, event: Event) -> Event:
        request = event.request_text
        if request is not None:
            self._requests.setdefault(event.run_id, {})[event.seq] = request
        value = event.value_json
        digest = blob_digest(value)
        if digest is not None and value is not None:
            self.blobs.setdefault(digest, value)
        return event

    def sync(self) -> None:
        pass  # nothing to make durable

    def close(self) -> None:
        pass
