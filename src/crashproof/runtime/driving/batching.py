"""Where async drives' commits run: the threads that wait on the disk or the database
(``off_loop``), and the batch that commits many drives' records in one transaction.

A thousand drives on one loop each reach a commit ten times a second. One transaction
apiece, on the loop or handed to a thread one by one, is what bounded them
(docs/benchmarks.md: ~160 µs a commit on the loop). So the drives that reach a commit in
the same turn of the loop are committed together: one transaction, one thread hop, while
the loop goes on with the others. Their output points (an act's intent, a run's outcome)
share a forced sync with those of every other turn written before it began: one sync in
flight per loop, and one witness write with it, so hundreds of runs in flight pay one
sync a round, not one a run; each still goes on only once its own records are on disk. A
drive alone commits as before: inline when its commit waits for no disk, else in a
thread. Each record keeps its crash points and durability (``commits.py``); the drives
never wait on each other's refusals (each record is refused alone: a savepoint per record
on SQLite, its own checks in the batch's SQL on PostgreSQL). A batch that fails as a
whole breaks every drive whose records were in it: each stops, writing nothing more
(journal order: ``commits.py``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import weakref
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, TypeVar

from crashproof.runtime.driving.durability import output_point
from crashproof.runtime.port import DriveHost, PendingRecord, WrittenBatch

__all__ = ["CommitBatcher", "batcher_for", "off_loop"]

# The threads async drives commit in (a commit waits on the disk or a database round
# trip, not on the GIL): more than asyncio's default of cores + 4, so that the runs on a
# loop overlap their round trips; a PostgreSQL store's pool bounds them again.
_COMMITS = concurrent.futures.ThreadPoolExecutor(
    max_workers=32, thread_name_prefix="crashproof-commit"
)

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a commit thread: journal I/O of an async drive (a commit, a
    journal read, a lease claim), so that the loop never waits on a round trip."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_COMMITS, contextvars.copy_context().run, fn, *args)


class Drive(Protocol):
    """What the batch needs of a drive's core (``Context``)."""

    def take_commits(self) -> list[PendingRecord]: ...

    def committed(
        self, group: list[PendingRecord], result: tuple[int, Exception] | None
    ) -> None: ...

    def store_failed(self, cause: BaseException) -> NoReturn: ...


Result = tuple[int, Exception] | None
_Waiting = tuple[list[PendingRecord], bool, "asyncio.Future[Result]"]
# A quick batch, what it wrote, and the indexes of its groups that wait for the disk.
_Unsynced = tuple[list[_Waiting], WrittenBatch, list[int]]


class CommitBatcher:
    """The commits of the async drives of one ledger on one loop, in two lanes.

    Local commits (SQLite short of "full" durability) are written on the loop's own
    thread, all those of a turn in one transaction, right after the turn. In a commit
    thread they would cost more than the commit: each statement hands the GIL over and
    back while the loop is busy with a thousand drives, and the thread waits for it every
    time (a convoy: ~30 µs a record, against ~10 on the loop). Only the waits leave the
    loop: a drive whose records hold an output point goes on once a commit thread's
    fsync made them durable (the others of the batch go on at once; one sync at a time
    covers every batch written before it began: ``_sync``), and SQLite's
    checkpoints run in a thread of their own (store/checkpointing.py). The other
    commits (a database round trip, "full" durability) go to a commit thread, one batch
    at a time; the drives that arrive meanwhile form the next. The two lanes never hold
    records of one run at once: a drive awaits each commit before its next."""

    def __init__(self, host: DriveHost, loop: asyncio.AbstractEventLoop) -> None:
        self._host = host
        self._loop = loop
        self._quick: list[_Waiting] = []
        self._waiting: list[_Waiting] = []
        self._due = False  # the quick lane is written after this turn
        self._busy = False  # a batch is being written in a thread, or is due this turn
        # Quick batches whose output points wait for the next forced sync (``_sync``).
        self._unsynced: list[_Unsynced] = []
        self._syncing = False  # a forced sync of quick batches is in flight

    async def commit(self, drive: Drive, quick: bool) -> None:
        """Commit ``drive``'s pending records; ``quick``: on the loop's thread (a local
        journal; an output point's fsync still waits in a commit thread)."""
        group = drive.take_commits()
        future: asyncio.Future[Result] = self._loop.create_future()
        if quick:
            self._quick.append((group, quick, future))
            if not self._due:
                self._due = True
                self._loop.call_soon(self._write_quick)  # after the drives of this turn
        else:
            self._waiting.append((group, quick, future))
            if not self._busy:
                self._busy = True
                self._loop.call_soon(self._write)  # after the drives that commit this turn
        try:
            result = await future
        except Exception as exc:  # the batch as a whole failed (or its fsync, its witness)
            drive.store_failed(exc)
        drive.committed(group, result)

    def _write_quick(self) -> None:
        batch, self._quick, self._due = self._quick, [], False
        groups = [group for group, _quick, _future in batch]
        host = self._host
        if len(groups) == 1:  # a drive alone commits record by record, as the sync shell
            if any(_output(record) for record in groups[0]):
                self._waiting += batch  # its fsync waits in a commit thread
                if not self._busy:
                    self._busy = True
                    self._write()
                return
            try:  # its one-statement commits (SQLiteStore.append), on the loop
                results = host.commit_batch(groups)
            except BaseException as exc:
                self._resolve(batch, None, exc)
            else:
                self._resolve(batch, results, None)
            return
        try:
            written = host.write_batch(groups)
        except BaseException as exc:
            self._resolve(batch, None, exc)
            return
        waits = [written.waits(i) for i in range(len(batch))]
        waiting = [i for i, wait in enumerate(waits) if wait]
        self._conclude(batch, written, [i for i, wait in enumerate(waits) if not wait])
        if waiting:  # their output points: on disk before they go on, the loop free meanwhile
            self._unsynced.append((batch, written, waiting))
            if not self._syncing:
                self._sync()

    def _sync(self) -> None:
        """One forced sync (and one witness write) in a commit thread for every batch
        written since the last one began: the output points of all the runs of this
        loop share it, one sync in flight at a time. A batch written while it is in
        flight waits for the next, which starts as soon as this one ends."""
        unsynced, self._unsynced = self._unsynced, []
        self._syncing = bool(unsynced)
        if not unsynced:
            return
        writtens = [written for _batch, written, _waiting in unsynced]
        synced = self._loop.run_in_executor(_COMMITS, self._host.wait_durable, writtens)
        synced.add_done_callback(lambda done: self._synced(unsynced, done))

    def _synced(self, unsynced: list[_Unsynced], done: asyncio.Future[None]) -> None:
        error = asyncio.CancelledError() if done.cancelled() else done.exception()
        try:
            for batch, written, waiting in unsynced:
                if error is not None:
                    self._resolve([batch[i] for i in waiting], None, error)
                else:
                    self._conclude(batch, written, waiting)
        finally:
            self._sync()  # the batches written meanwhile

    def _conclude(self, batch: list[_Waiting], written: WrittenBatch, groups: list[int]) -> None:
        """The groups' crash points, witness and observers (``conclude_batch``), then
        their drives go on with their results."""
        if not groups:
            return
        chosen = [batch[i] for i in groups]
        try:
            self._host.conclude_batch(written, groups)
        except BaseException as exc:
            self._resolve(chosen, None, exc)
        else:
            self._resolve(chosen, [written.results[i] for i in groups], None)

    def _write(self) -> None:
        batch, self._waiting = self._waiting, []
        if not batch:
            self._busy = False
            return
        groups = [group for group, _quick, _future in batch]
        done = self._loop.run_in_executor(_COMMITS, self._host.commit_batch, groups)
        done.add_done_callback(lambda future: self._written(batch, future))

    def _written(self, batch: list[_Waiting], done: asyncio.Future[list[Result]]) -> None:
        if done.cancelled():
            self._settle(batch, None, asyncio.CancelledError())
        elif (error := done.exception()) is not None:
            self._settle(batch, None, error)
        else:
            self._settle(batch, done.result(), None)

    def _settle(
        self, batch: list[_Waiting], results: list[Result] | None, error: BaseException | None
    ) -> None:
        self._resolve(batch, results, error)
        self._busy = False
        if self._waiting:  # arrived while this batch was written: the next batch
            self._busy = True
            self._write()

    @staticmethod
    def _resolve(
        batch: list[_Waiting], results: list[Result] | None, error: BaseException | None
    ) -> None:
        for index, (_group, _quick, future) in enumerate(batch):
            if future.done():  # its drive was cancelled meanwhile
                continue
            if results is None:
                future.set_exception(error or RuntimeError("batch commit failed"))
            else:
                future.set_result(results[index])


def _output(record: PendingRecord) -> bool:
    events, _status, _token, out = record
    return output_point(events[-1]) if out is None else out


class StartBatch:
    """New runs' starts of one turn of a loop, recorded together right after it on the
    loop's thread (``lifecycle.record_starts``: one witness write, one transaction): a
    thousand runs started at once, as ``asyncio.gather`` of ``run_async`` does, cost
    two commits, not two thousand. Each caller gets its run's own answer or error."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        write: Callable[[list[Any]], list[Any]],
        abandon: Callable[[Any], None],
    ) -> None:
        self._loop = loop
        self._write = write  # starts -> per start a result, or the Exception refusing it
        self._abandon = abandon  # a result whose caller is gone (its task was cancelled)
        self._waiting: list[tuple[Any, asyncio.Future[Any]]] = []

    async def submit(self, start: Any) -> Any:
        future: asyncio.Future[Any] = self._loop.create_future()
        if not self._waiting:
            self._loop.call_soon(self._run)  # after the starts of this turn
        self._waiting.append((start, future))
        return await future

    def _run(self) -> None:
        batch, self._waiting = self._waiting, []
        try:
            results = self._write([start for start, _future in batch])
        except BaseException as exc:  # the batch as a whole (a crash point, the disk)
            for _start, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_start, future), result in zip(batch, results, strict=True):
            if future.done():
                self._abandon(result)
            elif isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, CommitBatcher]] = (
    weakref.WeakKeyDictionary()
)


def batcher_for(host: DriveHost) -> CommitBatcher | None:
    """The batcher of ``host``'s drives on the running loop, where its store commits
    many runs' records in one transaction (``append_batch``: SQLite, PostgreSQL); None
    elsewhere (each drive commits in a thread of its own)."""
    if getattr(host.store, "append_batch", None) is None:
        return None
    loop = asyncio.get_running_loop()
    batchers = _BATCHERS.setdefault(loop, {})
    found = batchers.get(id(host))
    if found is None or found._host is not host:
        found = batchers[id(host)] = CommitBatcher(host, loop)
    return found
