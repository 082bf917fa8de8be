"""The storage port: the few operations the runtime needs from a durable store.

Every method is atomic on its own. Domain logic (replay, folding, policy) lives
above this port; a store only keeps runs and their append-only journals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from crashproof.journal.records import Event, RunRow, RunStatus

__all__ = ["BLOB_THRESHOLD", "GENESIS", "RecordSealer", "StatusChange", "Store"]

# Values at least this long (in bytes of JSON) are stored once, content-addressed.
BLOB_THRESHOLD = 1024

StatusChange = tuple[RunStatus, str | None]

GENESIS = ""  # the "previous MAC" of a run's first record


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


class Store(Protocol):
    """A durable home for runs and their journals."""

    def schema_version(self) -> int:
        """The schema version this store was written with."""
        ...

    def create_run(self, row: RunRow, first: Event) -> RunRow | None:
        """Insert ``row`` and its first event atomically, unless the run exists.

        Returns None when created, else the existing row (nothing is written).
        """
        ...

    def get_run(self, run_id: str) -> RunRow | None:
        """The run's index row, or None."""
        ...

    def list_runs(self, status: RunStatus | None = None) -> list[RunRow]:
        """Index rows, oldest first, optionally of one status."""
        ...

    def load_events(self, run_id: str) -> list[Event]:
        """The run's whole journal in sequence order, in one read."""
        ...

    def append(self, events: Sequence[Event], status: StatusChange | None = None) -> None:
        """Append events of one run (consecutive seqs) and optionally change its status,
        in one transaction. Raises StaleLeaseError if any seq is already taken:
        someone else wrote to this run, and nothing of this call is kept."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...
