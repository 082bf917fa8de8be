"""Forced syncs of a SQLite ledger in ``output`` durability, shared by concurrent runs.

In ``output`` durability the ledger commits with ``synchronous=NORMAL``: each commit
lands in the write-ahead log (the ``-wal`` file) without an fsync. Before something
leaves the process, the runtime asks for a forced sync: one ``fdatasync`` of the ``-wal``
file, which in WAL order makes every earlier commit durable too.

Why that is enough: SQLite appends commits to the WAL in order; a checkpoint (copying
WAL frames into the database file) syncs the WAL before it starts and the database file
after it ends, and the WAL is only reset (rewritten from its start) after a complete
checkpoint. So a record is durable once the ``-wal`` file was synced after its commit,
whether or not a checkpoint or a reset follows. A ``-wal`` file that does not exist any
more was checkpointed and removed by SQLite, its content synced into the database file.

Group commit (``GroupSync``): several threads that need a sync at about the same time
share one. The first becomes the leader and syncs everything committed so far; the
others wait, and are released when a sync that began after their commit ends (a
leader/follower committer, as in database group commit).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["GroupSync", "Note", "WalSyncer", "sync_directory"]

log = logging.getLogger(__name__)

# Run id -> generation: the output points a durable append (or a batch) made durable.
Note = Mapping[str, int]

# fdatasync syncs the data and the metadata needed to read it back (the size): what a
# durable WAL needs, without the timestamp updates fsync also waits for. (macOS has none.)
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class WalSyncer:
    """fdatasync of a SQLite database's ``-wal`` file (and, once per new file, of its
    directory, so the file's name is durable too).

    The file stays open between syncs: SQLite keeps one ``-wal`` file (same inode) while
    any connection is open, resetting and overwriting it after checkpoints. One ``stat``
    per sync checks that the name still leads to the file held open (a new inode: the
    old one is closed and the new one opened and synced), so a sync costs the
    ``fdatasync`` and one ``stat`` instead of ``open``, ``fstat`` and ``close`` as well.
    (The inode check is sound because the file is held open: a removed file's inode
    cannot be reused while a descriptor still refers to it.) ``close()`` releases it."""

    def __init__(self, database: Path) -> None:
        self.wal = database.with_name(database.name + "-wal")
        self._wal = str(self.wal)  # (os.open converts a Path on every call)
        self._fd: int | None = None
        self._inode: int | None = None  # of the file held open (its directory synced)

    def __call__(self) -> None:
        try:
            inode = os.stat(self._wal).st_ino
        except FileNotFoundError:
            self.close()
            return  # checkpointed and removed: its content was synced into the database
        fd = self._fd
        if fd is None or inode != self._inode:
            self._reopen()
        else:
            _datasync(fd)

    def _reopen(self) -> None:
        """Open (again) the file the name leads to now, sync it, then its directory."""
        self.close()
        try:
            fd = os.open(self._wal, os.O_RDWR)  # (Windows syncs only writable handles)
        except FileNotFoundError:
            return  # removed between the stat and the open: as in __call__
        try:
            inode = os.fstat(fd).st_ino
            _datasync(fd)  # before the directory: the name then leads to synced content
            sync_directory(self.wal.parent)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._inode = fd, inode

    def close(self) -> None:
        fd, self._fd, self._inode = self._fd, None, None
        if fd is not None:
            os.close(fd)


def sync_directory(directory: Path) -> None:
    """fsync a directory, so the names of the files just created in it are durable
    (best effort: a platform or filesystem that cannot is skipped)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a platform without directory fds (Windows): nothing to sync
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the data itself is synced
    finally:
        os.close(fd)


class GroupSync:
    """A leader/follower committer over ``flush``.

    ``flush()`` makes every commit so far durable and returns how many commits that
    covers (the store's commit counter, read before the sync starts). ``wait(ticket)``
    returns once commits up to ``ticket`` are durable: it flushes itself when no flush
    is in progress, else it parks until the flush in progress ends. The leader then
    wakes exactly the waiters its flush covered, and one waiter it did not cover (who
    committed after the flush began) to lead the next flush for all the rest; the others
    stay parked, costing no wake-up. ``flushes`` counts the flushes done (a real
    counter, for tests and benchmarks).

    ``after``: called by the leader once its flush succeeded, before it wakes anyone,
    with the ``note`` (run id -> generation) of itself and of every waiter the flush
    covered: what just became durable, so the generation witness can be advanced once
    for all of them (one write instead of one per run). Best effort: whatever it does
    not manage is asked again by each waiter (``Ledger._commit`` advances the witness
    after every durable append; an advance already made costs nothing there)."""

    def __init__(self, flush: Callable[[], int]) -> None:
        self._flush = flush
        self._mutex = threading.Lock()
        self._durable = 0
        self._leading = False
        # Parked waiters: (ticket, a lock held for them, released to wake them, note).
        self._parked: list[tuple[int, threading.Lock, Note | None]] = []
        self.flushes = 0
        self.after: Callable[[dict[str, int]], None] | None = None

    def wait(self, ticket: int, note: Note | None = None) -> None:
        while True:
            with self._mutex:
                if self._durable >= ticket:
                    return
                if not self._leading:
                    self._leading = True
                    break
                gate = threading.Lock()
                gate.acquire()
                entry = (ticket, gate, note)
                self._parked.append(entry)
            try:
                gate.acquire()  # woken: covered, or asked to lead (checked again above)
            except BaseException:  # interrupted while parked: never strand the others
                self._leave(entry)
                raise
        try:
            covered = self._flush()
        except BaseException:
            self._hand_over(None)  # nothing was made durable; a waiter leads a new try
            raise
        try:
            if self.after is not None:
                self._after(covered, note)
        finally:  # whatever happens there, the flush is done: never strand the others
            self._hand_over(covered)

    def _after(self, covered: int, own: Note | None) -> None:
        notes: dict[str, int] = {}
        with self._mutex:
            for ticket, _gate, note in self._parked:
                if note is not None and ticket <= covered:
                    _merge(notes, note)
        if own is not None:
            _merge(notes, own)
        if not notes or self.after is None:
            return
        try:
            self.after(notes)
        except Exception as exc:  # each waiter asks again, and reports a failure itself
            log.debug("advancing %d runs after a group sync failed: %r", len(notes), exc)

    def _hand_over(self, covered: int | None) -> None:
        with self._mutex:
            if covered is not None:
                self.flushes += 1
                if covered > self._durable:
                    self._durable = covered
            self._leading = False
            parked = self._parked
            if not parked:
                return
            durable = self._durable
            left = []
            for entry in parked:
                if entry[0] <= durable:
                    entry[1].release()
                else:
                    left.append(entry)
            if left:
                left.pop(0)[1].release()  # the next leader (it syncs what came since)
            self._parked = left

    def _leave(self, entry: tuple[int, threading.Lock, Note | None]) -> None:
        with self._mutex:
            if entry in self._parked:
                self._parked.remove(entry)
            elif self._parked and not self._leading:
                # It was woken to lead: pass that on.
                self._parked.pop(0)[1].release()


def _merge(notes: dict[str, int], note: Note) -> None:
    """Each run's highest generation of ``notes`` and ``note``, in ``notes``."""
    for run_id, generation in note.items():
        if notes.get(run_id, -1) < generation:
            notes[run_id] = generation
