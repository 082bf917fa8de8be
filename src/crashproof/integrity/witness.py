"""The generation witness: anti-rollback for the journal.

Each run's generation (its number of journal records) is mirrored in a store outside
the journal — a separate SQLite file beside the ledger by default. A valid HMAC proves
a record is authentic, not that it is the newest: a restored backup or VM snapshot is
perfectly authentic. The witness catches it: a journal shorter than its witness was
rolled back. A journal longer than its witness is accepted when its chain verifies
(the crash fell between a commit and the witness update, or records past the witness
were never externalised) and the witness is rolled forward.

The witness advances at output points only (an act about to execute, an outbox delivery,
a run's outcome or approval request; see crashproof.runtime.driving.durability), and only after the
forced sync that makes the journal durable up to there: it is never ahead of what a power
cut leaves on disk. A rollback that only drops records nobody outside saw (local steps,
model decisions, receipts) is harmless, like a crash before them, and skipping the
witness there keeps those records at one unsynced write.

Every write of the SQLite witness is durable when it returns (``synchronous=FULL``: its
write-ahead log is fsynced at each commit), for two reasons a power cut shows:

- a new run's row (generation 0) is written before the run's first journal record, so
  it is on disk before any record of the run can be (synced, or written back by the
  kernel unsynced). A journal without its witness row therefore never comes from a
  power cut: it comes from another ledger, a lost or replaced witness, or a deleted
  row, and is refused (``WitnessMissing``). Accepting an absent row as generation 0
  instead would need proof that the witness never had it; any such proof written to
  the witness after the row would make the row durable too (one log, in order), so it
  costs the same fsync and is only weaker;
- an advance at an output point is durable before the output leaves the process: a
  lost advance would leave the witness at an older output point, and a journal copy
  restored to between the two would pass the check and do the later effects again.

Concurrent writers share one transaction and one fsync (``_submit``). Limits: the
witness must live where a restore of the ledger does not also restore it (another disk,
another host, PostgreSQL); beside the ledger it guards against restoring the ledger
file alone.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from crashproof.errors import JournalRolledBack, LedgerError, WitnessMissing
from crashproof.store.sqlite_file import enter_wal
from crashproof.store.syncing import sync_directory

__all__ = ["MemoryWitness", "SQLiteWitness", "Witness", "compare", "lost"]

_MADE_KEPT = 100_000  # runs remembered by SQLiteWitness._made
_ADVANCE = "UPDATE witness SET generation = ?, updated_at = ? WHERE run_id = ? AND generation < ?"
_START = (
    "INSERT INTO witness (run_id, generation, updated_at) VALUES (?, 0, ?) "
    "ON CONFLICT (run_id) DO NOTHING"
)
# A deliberately WRONG variant, for the power-cut verifier's own test only: witness
# writes are not synced (synchronous=NORMAL), so a power cut may lose a new
# run's row while its journal's records survive. Never set it outside that test.
_UNSAFE_UNSYNCED = False


class Witness(Protocol):
    def get(self, run_id: str) -> int | None:
        """The witnessed generation of a run, or None when the witness never saw it."""
        ...

    def start(self, run_id: str) -> None:
        """Record generation 0 for a new run (before its first commit), durable where
        a power cut could otherwise keep the run's records and lose the row."""
        ...

    def advance(self, run_id: str, generation: int) -> None:
        """Raise the witnessed generation (never lowers it); durable before the output
        it stands for leaves the process."""
        ...

    def reset(self, run_id: str, generation: int) -> None:
        """Set the generation whatever it was (the operator's explicit re-anchor)."""
        ...

    def known(self) -> dict[str, int]:
        """Every run the witness saw, with its generation: a run the journal lost (a
        deleted ``-wal``) is still here, so ``check`` reports it instead of all clear."""
        ...

    def close(self) -> None: ...


def lost(run_id: str, witnessed: int) -> JournalRolledBack:
    """The error for a run the witness saw at ``witnessed`` (> 0) and the journal does not
    hold at all."""
    return JournalRolledBack(
        f"run {run_id!r} is lost from the journal: the witness saw generation {witnessed}, "
        "the journal holds no record of it (its -wal deleted or truncated after a crash, "
        "or an older copy of the ledger restored); nothing was executed."
    )


def compare(run_id: str, journal: int, witnessed: int | None) -> bool:
    """Check a journal's generation against its witness; True when it is ahead (the
    caller may roll the witness forward). Raises on rollback or a missing witness."""
    if witnessed is None:
        raise WitnessMissing(
            f"run {run_id!r} has {journal} journal records but no witness entry; it may "
            "come from another ledger or the witness was lost. Nothing was executed. If you "
            "trust this journal, re-anchor it: crashproof reanchor RUN_ID --by NAME"
        )
    if journal < witnessed:
        raise JournalRolledBack(
            f"run {run_id!r} was rolled back: the witness saw generation {witnessed}, the "
            f"journal holds {journal}. An older copy of the ledger was restored (or the "
            "ledger was deleted and re-created beside its old witness file); nothing was "
            "executed."
        )
    return journal > witnessed


class MemoryWitness:
    def __init__(self) -> None:
        self._gen: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, run_id: str) -> int | None:
        return self._gen.get(run_id)

    def start(self, run_id: str) -> None:
        with self._lock:
            self._gen.setdefault(run_id, 0)

    def advance(self, run_id: str, generation: int) -> None:
        with self._lock:
            self._gen[run_id] = max(self._gen.get(run_id, 0), generation)

    def reset(self, run_id: str, generation: int) -> None:
        with self._lock:
            self._gen[run_id] = generation

    def known(self) -> dict[str, int]:
        with self._lock:
            return dict(self._gen)

    def close(self) -> None:
        pass


class SQLiteWitness:
    """A witness in its own SQLite file (WAL, synchronous=FULL: each write durable)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()  # the connection's
        # Writes asked for and not yet made: concurrent runs (threads released by one
        # group sync, threads starting runs) share one transaction and one fsync
        # (_submit). Guarded by _asking; tickets count asks.
        self._asking = threading.Lock()
        self._pending: dict[str, int] = {}  # advances: run id -> generation
        self._starting: dict[str, None] = {}  # new runs' rows (generation 0)
        self._asked = 0
        self._written = 0  # every ask up to this ticket is written (under _lock)
        # The highest generation this object wrote per run (under _lock; read without):
        # an advance at or below it is already in the file.
        self._made: dict[str, int] = {}
        # Whether a commit is durable as it returns (False only in the unsafe variant).
        self.synced = not _UNSAFE_UNSYNCED
        # Called under the witness's lock, with the witness's path, after every write
        # that is durable (test instrumentation: the power-cut verifier's snapshots).
        self.on_sync: list[Callable[[Path], None]] = []
        created = not path.exists()
        try:
            self._conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=5.0
            )
            enter_wal(self._conn, 5.0)  # (another process may be creating it too)
            self._conn.execute(f"PRAGMA synchronous={'FULL' if self.synced else 'NORMAL'}")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS witness (run_id TEXT PRIMARY KEY, "
                "generation INTEGER NOT NULL, updated_at REAL NOT NULL) STRICT"
            )
            self._cursor = self._conn.cursor()  # _submit's (under _lock)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open the generation witness {path}: {exc}") from None
        if created:  # the file's name durable too, before any row in it counts
            sync_directory(path.parent)

    def get(self, run_id: str) -> int | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT generation FROM witness WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if row is None else int(row[0])

    def get_many(self, run_ids: Sequence[str]) -> dict[str, int]:
        """``get`` of several runs in one read (an async loop's starts of one turn): the
        generations of those the witness saw."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT run_id, generation FROM witness "
                "WHERE run_id IN (SELECT value FROM json_each(?))",
                (json.dumps(list(run_ids)),),
            ).fetchall()
        return {str(run_id): int(generation) for run_id, generation in rows}

    def known(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute("SELECT run_id, generation FROM witness").fetchall()
        return {str(run_id): int(generation) for run_id, generation in rows}

    def start(self, run_id: str) -> None:
        """Record generation 0 for a new run; returns once it is durable."""
        self._submit((run_id,), {})

    def start_many(self, run_ids: Sequence[str]) -> None:
        """``start`` of several new runs in one write (an async loop's starts of a turn)."""
        self._submit(run_ids, {})

    def advance(self, run_id: str, generation: int) -> None:
        """Returns once a durable write made after this call began holds ``generation``
        (or more) for the run; at once when this witness wrote that already (the group
        sync's leader advances every run its sync covered: ``advance_many``)."""
        if self._made.get(run_id, -1) < generation:
            self._submit((), {run_id: generation})

    def advance_many(self, generations: dict[str, int]) -> None:
        """Raise several runs' generations (never lowering one); returns once a durable
        write made after this call began holds them, at once for those this witness
        wrote already (an async batch's, advanced by the group sync's leader: no fsync
        on the loop's thread)."""
        made = self._made
        wanted = {run: gen for run, gen in generations.items() if made.get(run, -1) < gen}
        if wanted:
            self._submit((), wanted)

    def _submit(self, starts: Sequence[str], generations: dict[str, int]) -> None:
        """Write new runs' rows and advances; returns once a durable write made after
        this call began holds them. Concurrent callers combine: whoever takes the
        connection next writes everything asked so far in one transaction (one fsync),
        and the callers it covered return without writing."""
        asking = self._asking
        with asking:
            for run_id in starts:
                self._starting[run_id] = None
            pending = self._pending
            for run_id, generation in generations.items():
                if pending.get(run_id, -1) < generation:
                    pending[run_id] = generation
            self._asked = ticket = self._asked + 1
        with self._lock:
            if self._written >= ticket:
                return  # covered by the batch another caller wrote meanwhile
            with asking:
                batch, self._pending = self._pending, {}
                started, self._starting = list(self._starting), {}
                upto = self._asked
            try:
                if len(batch) == 1 and not started:  # the usual case: one statement
                    ((run_id, generation),) = batch.items()
                    self._cursor.execute(_ADVANCE, (generation, time.time(), run_id, generation))
                elif batch or started:
                    self._write_batch(started, batch)
            except BaseException as exc:
                with asking:  # not written: the next caller tries these again
                    for run_id in started:
                        self._starting[run_id] = None
                    for run_id, generation in batch.items():
                        if self._pending.get(run_id, -1) < generation:
                            self._pending[run_id] = generation
                if isinstance(exc, sqlite3.Error):
                    raise LedgerError(f"cannot update the witness {self.path}: {exc}") from None
                raise
            made = self._made
            if len(made) > _MADE_KEPT:
                made.clear()  # only a shortcut: forgetting costs one write per run
            for run_id in started:
                # An advance made before the row existed changed nothing: ask again.
                if run_id not in batch:
                    made.pop(run_id, None)
            for run_id, generation in batch.items():
                if made.get(run_id, -1) < generation:
                    made[run_id] = generation
            self._written = upto
            self._synced()

    def _write_batch(self, started: list[str], batch: dict[str, int]) -> None:
        """Write new rows, then advances (run id -> generation), in one transaction;
        under _lock."""
        now = time.time()
        conn = self._cursor
        conn.execute("BEGIN IMMEDIATE")
        try:
            if started:
                conn.executemany(_START, [(run_id, now) for run_id in started])
            if batch:
                conn.executemany(_ADVANCE, [(gen, now, run, gen) for run, gen in batch.items()])
            conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _synced(self) -> None:
        """A write just committed (under _lock): durable, unless in the unsafe variant."""
        if self.synced:
            for listener in self.on_sync:
                listener(self.path)

    def reset(self, run_id: str, generation: int) -> None:
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO witness (run_id, generation, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (run_id) DO UPDATE SET generation = excluded.generation, "
                    "updated_at = excluded.updated_at",
                    (run_id, generation, time.time()),
                )
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot update the witness {self.path}: {exc}") from None
            self._made[run_id] = generation  # set, even lower: what the file now holds
            self._synced()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
