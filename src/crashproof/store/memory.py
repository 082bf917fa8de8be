"""An in-memory store: the fake shipped to users and the contract suite's reference."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence

from crashproof.errors import StaleLeaseError
from crashproof.journal.records import Event, RunRow, RunStatus
from crashproof.store.port import BLOB_THRESHOLD, StatusChange

__all__ = ["MemoryStore"]

SCHEMA_VERSION = 1


class MemoryStore:
    """Keeps everything in dicts; thread-safe; lost with the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, RunRow] = {}
        self._events: dict[str, list[Event]] = {}
        self.blobs: dict[str, str] = {}  # digest -> JSON text, shared by equal values

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def create_run(self, row: RunRow, first: Event) -> RunRow | None:
        with self._lock:
            existing = self._runs.get(row.run_id)
            if existing is not None:
                return existing
            self._runs[row.run_id] = row
            self._events[row.run_id] = [self._keep(first)]
            return None

    def get_run(self, run_id: str) -> RunRow | None:
        with self._lock:
            return self._runs.get(run_id)

    def list_runs(self, status: RunStatus | None = None) -> list[RunRow]:
        with self._lock:
            rows = sorted(self._runs.values(), key=lambda r: (r.created_at, r.run_id))
        return [r for r in rows if status is None or r.status == status]

    def load_events(self, run_id: str) -> list[Event]:
        with self._lock:
            return list(self._events.get(run_id, ()))

    def append(self, events: Sequence[Event], status: StatusChange | None = None) -> None:
        if not events:
            return
        run_id = events[0].run_id
        with self._lock:
            journal = self._events.get(run_id)
            row = self._runs.get(run_id)
            if journal is None or row is None:
                raise StaleLeaseError(f"run {run_id!r} does not exist in this store")
            for offset, event in enumerate(events):
                if event.run_id != run_id or event.seq != len(journal) + offset:
                    raise StaleLeaseError(
                        f"run {run_id!r}: sequence {event.seq} is already taken or out of "
                        "order; another writer is appending to this run"
                    )
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

    def _keep(self, event: Event) -> Event:
        if event.value_json is not None and len(event.value_json) >= BLOB_THRESHOLD:
            digest = hashlib.sha256(event.value_json.encode()).hexdigest()
            self.blobs.setdefault(digest, event.value_json)
        return event

    def close(self) -> None:
        pass
