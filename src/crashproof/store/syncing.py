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

import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["GroupSync", "WalSyncer"]

# fdatasync syncs the data and the metadata needed to read it back (the size): what a
# durable WAL needs, without the timestamp updates fsync also waits for. (macOS has none.)
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class WalSyncer:
    """fdatasync of a SQLite database's ``-wal`` file (and, once per new file, of its
    directory, so the file's name is durable too)."""

    def __init__(self, database: Path) -> None:
        self.wal = database.with_name(database.name + "-wal")
        self._synced_inode: int | None = None

    def __call__(self) -> None:
        try:
            fd = os.open(self.wal, os.O_RDWR)  # (Windows syncs only writable handles)
        except FileNotFoundError:
            return  # checkpointed and removed: its content was synced into the database
        try:
            _datasync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        if inode != self._synced_inode:
            _sync_directory(self.wal.parent)
            self._synced_inode = inode


def _sync_directory(directory: Path) -> None:
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
    covers (the store's commit counter, read where no commit can be in progress).
    ``wait(ticket)`` returns once commits up to ``ticket`` are durable, flushing itself
    when no flush is in progress, else waiting for the one that is, then checking again.
    ``flushes`` counts the flushes done (a real counter, for tests and benchmarks)."""

    def __init__(self, flush: Callable[[], int]) -> None:
        self._flush = flush
        self._cond = threading.Condition()
        self._durable = 0
        self._leading = False
        self.flushes = 0

    def wait(self, ticket: int) -> None:
        with self._cond:
            while self._durable < ticket:
                if not self._leading:
                    self._leading = True
                    break
                self._cond.wait()
            else:
                return
        try:
            covered = self._flush()
        except BaseException:
            with self._cond:
                self._leading = False
                self._cond.notify_all()  # another waiter leads the next attempt
            raise
        with self._cond:
            self._leading = False
            self.flushes += 1
            self._durable = max(self._durable, covered)
            self._cond.notify_all()  # followers covered return; the others elect a leader
