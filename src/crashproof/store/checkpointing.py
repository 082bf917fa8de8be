"""Checkpoints of a SQLite ledger's write-ahead log away from the thread that commits.

SQLite copies the ``-wal`` file's pages back into the database file (a checkpoint)
inside whichever commit makes the log cross ~1,000 pages: ~10 ms of writes and two
fsyncs in that commit. An async loop commits on its own thread
(``runtime/driving/batching.py``), so the whole loop stalled for it: with 1,024
concurrent runs, checkpoints were ~10 % of the wall (bench/concurrency.py,
docs/benchmarks.md). Those commits (``SQLiteStore.write_batch``) are made with the
automatic checkpoint off; this checkpointer runs it instead, in a thread of its own on a
connection of its own, while the loop goes on committing. SQLite makes that safe: a
PASSIVE checkpoint takes no write lock and copies only committed frames. The log starts
over (instead of growing) only at a commit that finds every frame copied, so a last
pass runs under the store's lock: the loop waits for it, but it copies only what was
committed during the passes before it (commits land all the time under load).

The other commits (the sync shell's, a commit thread's) keep SQLite's automatic
checkpoint: they wait in a thread anyway. If this checkpointer falls behind (the loop
wrote ``BEHIND`` times the threshold since it last finished), the loop's commits take
the automatic checkpoint again until it catches up, so the log stays bounded.

Records stand in for log pages (Python's sqlite3 exposes no WAL hook): a checkpoint is
due after ``threshold`` records, about 1,000 pages when a thousand runs interleave
(each record on a page of its own run), far fewer for one run alone.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Checkpointer"]

log = logging.getLogger(__name__)

BEHIND = 4  # thresholds written meanwhile: the automatic checkpoint comes back


class Checkpointer:
    """Background checkpoints of one SQLite database (see the module's docstring)."""

    def __init__(
        self, path: Path, busy_timeout: float, lock: threading.Lock, threshold: int = 1000
    ) -> None:
        self._path = path
        self._lock = lock  # the store's: no commit during the last pass
        self._busy_timeout = busy_timeout
        self.threshold = threshold
        self._cond = threading.Condition()
        self._written = 0  # records committed without a checkpoint since the last one
        self._due = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        # Held while a checkpoint runs: ``paused()`` waits for it (a test's snapshot of
        # the files must not copy the database file half-written).
        self._gate = threading.Lock()
        self.checkpoints = 0  # how many ran (tests, benchmarks)

    def defer(self) -> bool:
        """Whether the next commit may leave its checkpoint to this thread (False when
        it fell behind, or is closed: SQLite's own then runs in the commit)."""
        with self._cond:
            behind = self._written >= BEHIND * self.threshold
            return self.threshold > 0 and not self._closed and not behind

    def wrote(self, records: int) -> None:
        """A commit of ``records`` made with the automatic checkpoint off."""
        with self._cond:
            self._written += records
            if self._written < self.threshold or self._due or self._closed:
                return
            self._due = True
            if self._thread is None or not self._thread.is_alive():  # (also after a fork)
                self._thread = threading.Thread(
                    target=self._run, name="crashproof-checkpoint", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No checkpoint runs inside this block."""
        with self._gate:
            yield

    def close(self) -> None:
        """Stop the thread (after the checkpoint it is running) and its connection."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._due = False
                taken = self._written
            done = self._checkpoint()
            with self._cond:
                if done:  # what was written meanwhile waits for the next one
                    self._written = max(0, self._written - taken)

    def _checkpoint(self) -> bool:
        """The bulk in PASSIVE passes while commits go on, the rest in one under the
        store's lock (then the next commit starts the log over); False when SQLite
        refused one."""
        try:
            with self._gate:
                self._pass()
                self._pass()  # what landed during the first: the locked one is short
            with self._lock, self._gate:  # (the order _flush takes them in)
                self._pass()
        except sqlite3.Error as exc:  # the commits' own checkpoints take over (defer)
            # (Busy while another connection checkpoints, most often: not worth a warning;
            # a disk that fails fails the commits too, loudly.)
            log.debug("checkpoint of %s failed: %s", self._path, exc)
            return False
        self.checkpoints += 1
        return True

    def _pass(self) -> None:
        if self._conn is None:
            self._conn = sqlite3.connect(
                self._path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout,
            )
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
