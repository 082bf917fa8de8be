"""Power-cut simulation for the verifier: keep what a power loss would leave on disk.

A SIGKILL never loses an unsynced write: the operating system's page cache survives the
process and reaches the disk later. A power cut loses everything written since the last
fsync. In ``output`` durability that is by design (only output points are synced), so
the verifier has to show that nothing outside ever depended on a lost write.

``DurableSnapshots`` keeps, for every file a SQLite ledger depends on, the content its
own last sync made durable, each file group on its own clock:

- the ledger (the database and its ``-wal``): copied at every forced sync of a store in
  ``output`` durability (under the store's lock, so no commit is half-written);
- its generation witness (``<ledger>.witness`` and its ``-wal``): copied after every
  witness write that synced as it committed (``SQLiteWitness.on_sync``), and when it
  is attached if what its file holds is durable. A witness whose writes are not synced
  keeps only what a sync made durable before (nothing, for a new one).

``restore()`` puts each group back as of its own last sync (or removes it, if nothing of
it was ever synced; a witness never attached stays as it is) and removes the
shared-memory indexes, as a rebooted machine would find them. Test instrumentation only:
the copies cost what the syncs save.

Limit: a power cut may also keep some unsynced writes (the kernel wrote them back); this
keeps none, the harshest case. The real-filesystem trials (tests/crash/
test_powercut_image.py) take the other cases.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from crashproof.integrity.witness import SQLiteWitness
from crashproof.runtime.ledger import Ledger
from crashproof.store.sqlite import SQLiteStore

__all__ = ["DurableSnapshots", "attach"]

_SUFFIXES = ("", "-wal")
_COMPLETE = "complete"  # in a snapshot's directory: every file of it was copied


class _Durable:
    """The last durable state of one SQLite file (and its ``-wal``), kept in
    ``directory``. ``always``: restored even if never tracked (the ledger); else only
    once ``track`` was called (a witness never attached is left as it is)."""

    def __init__(self, database: Path, directory: Path, *, always: bool = True) -> None:
        self.database = database
        self.directory = directory
        self._always = always
        self._tracked = directory.with_name(directory.name + ".tracked")

    def track(self) -> None:
        self._tracked.parent.mkdir(parents=True, exist_ok=True)
        self._tracked.touch()

    def take(self) -> None:
        # Whole or not at all, also when the process is SIGKILLed in the middle (chaos
        # mode's power cuts): a staging copy marked complete, then swapped in; restore
        # prefers a complete staging copy (the swap was cut short) to the directory.
        staging = self._staging
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for suffix in _SUFFIXES:
            source = self.database.with_name(self.database.name + suffix)
            if source.exists():
                shutil.copyfile(source, staging / (self.database.name + suffix))
        (staging / _COMPLETE).touch()
        shutil.rmtree(self.directory, ignore_errors=True)
        staging.rename(self.directory)

    @property
    def _staging(self) -> Path:
        return self.directory.with_name(self.directory.name + ".new")

    def restore(self) -> None:
        if not self._always and not self._tracked.exists():
            return
        for suffix in (*_SUFFIXES, "-shm"):
            self.database.with_name(self.database.name + suffix).unlink(missing_ok=True)
        source = self._staging if (self._staging / _COMPLETE).exists() else self.directory
        if not (source / _COMPLETE).exists():
            return  # never synced: a power cut leaves no such file
        for suffix in _SUFFIXES:
            kept = source / (self.database.name + suffix)
            if kept.exists():
                shutil.copyfile(kept, self.database.with_name(self.database.name + suffix))


class DurableSnapshots:
    """The last durable state of the SQLite ledger at ``database``, kept in
    ``directory``, and of its witness, in ``<directory>.witness`` (both survive ledger
    objects: attach every store and witness opened on the ledger)."""

    def __init__(self, database: Path, directory: Path) -> None:
        self.database = database
        self.directory = directory
        self.witness = database.with_name(database.name + ".witness")
        self._ledger = _Durable(database, directory)
        self.witness_directory = directory.with_name(directory.name + ".witness")
        self._witness = _Durable(self.witness, self.witness_directory, always=False)
        self.taken = 0  # snapshots of the ledger taken by this object
        self.witness_taken = 0  # snapshots of the witness taken by this object

    def attach(self, store: SQLiteStore) -> None:
        if store.durability != "output":
            raise ValueError(
                f"power-cut snapshots need a store in 'output' durability, not "
                f"{store.durability!r}: only there do forced syncs mark what is durable"
            )
        if store.path.resolve() != self.database.resolve():
            raise ValueError(f"this snapshot keeps {self.database}, not {store.path}")
        store.on_sync.append(self._take)

    def attach_witness(self, witness: SQLiteWitness) -> None:
        """Snapshot ``witness`` (the ledger's) after each of its durable writes."""
        if witness.path.resolve() != self.witness.resolve():
            raise ValueError(f"this snapshot keeps the witness {self.witness}, not {witness.path}")
        self._witness.track()
        if witness.synced:  # what it holds now was synced as it was written
            with witness._lock:
                self._take_witness(witness.path)
        witness.on_sync.append(self._take_witness)

    def _take(self, database: Path) -> None:
        self._ledger.take()
        self.taken += 1

    def _take_witness(self, path: Path) -> None:
        self._witness.take()
        self.witness_taken += 1

    def restore(self) -> None:
        """Replace the ledger's files and its witness's by their last durable snapshots;
        every store and witness on them must be closed first."""
        self._ledger.restore()
        self._witness.restore()


def attach(ledger: Ledger, snapshots: DurableSnapshots) -> None:
    """Snapshot the durable state of ``ledger`` (a SQLite ledger in ``output``
    durability) at each of its forced syncs, and of its witness at each of its own."""
    store = ledger._store  # the verifier instruments the store the Ledger opened
    if not isinstance(store, SQLiteStore):
        raise ValueError(
            f"power-cut mode simulates a SQLite ledger's files; {ledger.shown_url} is not one"
        )
    snapshots.attach(store)
    witness = ledger.witness
    if isinstance(witness, SQLiteWitness):
        snapshots.attach_witness(witness)
