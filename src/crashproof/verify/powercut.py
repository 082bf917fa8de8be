"""Power-cut simulation for the verifier: keep what a power loss would leave on disk.

A SIGKILL never loses an unsynced write: the operating system's page cache survives the
process and reaches the disk later. A power cut loses everything written since the last
fsync. In ``output`` durability that is by design (only output points are synced), so
the verifier has to show that nothing outside ever depended on a lost write.

``DurableSnapshots`` attaches to a SQLite store in ``output`` durability and, at every
forced sync (under the store's lock, so no commit is half-written), copies the ledger
files — the database and its ``-wal`` — into a directory: exactly the state that sync
makes durable. ``restore()`` puts that state back (or no ledger at all, if nothing was
ever synced) and removes the shared-memory index, as a rebooted machine would find it.
Test instrumentation only: the copies cost what the sync saves.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from crashproof.runtime.ledger import Ledger
from crashproof.store.sqlite import SQLiteStore

__all__ = ["DurableSnapshots", "attach"]

_SUFFIXES = ("", "-wal")


class DurableSnapshots:
    """The last durable state of the SQLite ledger at ``database``, kept in ``directory``
    (which survives ledger objects: attach every store opened on the ledger)."""

    def __init__(self, database: Path, directory: Path) -> None:
        self.database = database
        self.directory = directory
        self.taken = 0  # snapshots taken by this object

    def attach(self, store: SQLiteStore) -> None:
        if store.durability != "output":
            raise ValueError(
                f"power-cut snapshots need a store in 'output' durability, not "
                f"{store.durability!r}: only there do forced syncs mark what is durable"
            )
        if store.path.resolve() != self.database.resolve():
            raise ValueError(f"this snapshot keeps {self.database}, not {store.path}")
        store.on_sync.append(self._take)

    def _take(self, database: Path) -> None:
        staging = self.directory.with_name(self.directory.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for suffix in _SUFFIXES:
            source = database.with_name(database.name + suffix)
            if source.exists():
                shutil.copyfile(source, staging / (self.database.name + suffix))
        shutil.rmtree(self.directory, ignore_errors=True)
        staging.rename(self.directory)
        self.taken += 1

    def restore(self) -> None:
        """Replace the ledger files by the last durable snapshot; every store on them
        must be closed first."""
        for suffix in (*_SUFFIXES, "-shm"):
            self.database.with_name(self.database.name + suffix).unlink(missing_ok=True)
        if not self.directory.is_dir():
            return  # nothing was ever synced: a power cut leaves no ledger
        for suffix in _SUFFIXES:
            kept = self.directory / (self.database.name + suffix)
            if kept.exists():
                shutil.copyfile(kept, self.database.with_name(self.database.name + suffix))


def attach(ledger: Ledger, snapshots: DurableSnapshots) -> None:
    """Snapshot the durable state of ``ledger`` (a SQLite ledger in ``output``
    durability) at each of its forced syncs."""
    store = ledger._store  # the verifier instruments the store the Ledger opened
    if not isinstance(store, SQLiteStore):
        raise ValueError(
            f"power-cut mode simulates a SQLite ledger's files; {ledger.shown_url} is not one"
        )
    snapshots.attach(store)
