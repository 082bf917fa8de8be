"""How a drive's records reach the store: one at a time (the sync shell, and an async
drive alone on its loop), or many async drives' records in one transaction (a batch,
``runtime/driving/batching.py``). Either way each record has its crash points on each
side of its commit, and an output point is durable before the call returns
(``durability.py``). A mixin of the Ledger, which holds the store and the witness.

Journal order (DESIGN.md §11, invariant 8): no record of a run is committed after an
earlier record of that run failed to commit. A commit that *fails* (the store's own
error: a lost connection, a failed COMMIT, a full disk; ``is_failure``) leaves its
outcome unknown: the record may or may not have landed. The drive that made it cannot
tell, so it must write nothing more; the next drive reads what is durable and goes on
from there (an act whose intent landed is looked up, a decision whose record was lost
is asked again). Here that is structural: the (run, fencing token) of a failed commit,
in the sync path and in a batch (every run whose records were in a batch that failed
as a whole), is *broken*, and every later record of it is refused before it reaches the
store, whatever the caller does with the error. A *refusal* (``IntentHeld``, a lost
lease) is not a failure: the store answered that the record was not kept, so the
journal is exactly as before it.

The drive itself stops too (``Context.store_failed``): the failure travels up as
``StoreFailed``, a BaseException like a crash point, so that neither a recorder nor the
user's code can take it for a call's outcome; the ledger turns it into a ``LedgerError``
for its caller (``store_failure``) at the drive's edge."""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence

from crashproof._faults import CrashPoints
from crashproof.errors import CrashproofError, LedgerError, StaleLeaseError
from crashproof.integrity.witness import Witness
from crashproof.journal.records import Event
from crashproof.runtime.driving.durability import output_point
from crashproof.runtime.port import PendingRecord, WrittenBatch
from crashproof.runtime.steps.scopes import CallScope
from crashproof.store.port import RecordAppend, StatusChange, Store

__all__ = [
    "CommitObserver",
    "JournalCommits",
    "StoreFailed",
    "is_failure",
    "store_edge",
    "store_failure",
]

log = logging.getLogger(__name__)

# Told of every record a drive of this process committed, with the lease it was written
# under (telemetry: crashproof.integrations.otel). Replay commits nothing, so an observer
# never hears of a replayed call twice.
CommitObserver = Callable[[Sequence[Event], "int | None"], None]


class StoreFailed(BaseException):
    """A drive's journal can take no more records: one of its commits (or a read of its
    journal) failed with ``cause``, an error of the ledger itself. Raised through the
    recorders and the user's code as a crash point is (no ``except Exception`` takes it
    for a call's outcome); the ledger raises ``store_failure(run_id, cause)`` instead
    once it reaches the drive's edge. Never journaled."""

    def __init__(self, run_id: str, cause: BaseException) -> None:
        super().__init__(f"run {run_id!r}: the ledger failed: {cause}")
        self.run_id = run_id
        self.cause = cause


def is_failure(exc: BaseException) -> bool:
    """Whether a commit's error is a failure of the ledger (its outcome unknown: the
    drive must stop) rather than a refusal the store answered deliberately (a lost
    lease, an intent held: nothing kept, and known so)."""
    return isinstance(exc, LedgerError) or not isinstance(exc, CrashproofError)


def store_failure(run_id: str, cause: BaseException) -> LedgerError:
    """What the caller of a drive that ``StoreFailed`` gets: the run is left as a crash
    at that point would leave it, resumable from what was committed."""
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return LedgerError(
        f"run {run_id!r}: the ledger failed while recording it ({first}); nothing more "
        "was written for this run, which stays resumable from what was committed: "
        f"Ledger.resume({run_id!r}) or crashproof resume {shlex.quote(run_id)} --app "
        "MODULE once the ledger is reachable (or let a worker take it)"
    )


@contextlib.contextmanager
def store_edge(run_id: str) -> Iterator[None]:
    """A drive's edge (inside its lease, which a LedgerError releases): ``StoreFailed``
    becomes the ``store_failure`` its caller gets, also from the group a framework's
    task group raised it in."""
    try:
        yield
    except StoreFailed as failed:
        raise store_failure(run_id, failed.cause) from failed.cause
    except BaseExceptionGroup as group:
        found: BaseException | None = group.subgroup(StoreFailed)
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        if not isinstance(found, StoreFailed):
            raise
        raise store_failure(run_id, found.cause) from group


class JournalCommits:
    _store: Store
    _witness: Witness | None
    _stale: set[tuple[str, int]]  # (run id, token) whose lease was lost
    # (run id, token) a drive's commit of which failed: refused from then on (journal
    # order). A write outside a drive (no token: an operator's cancel) breaks nothing.
    _broken: dict[tuple[str, int | None], BaseException]
    crash_points: CrashPoints | None
    commit_observers: tuple[CommitObserver, ...] = ()
    call_scopes: tuple[CallScope, ...] = ()

    def on_call(self, scope: CallScope) -> None:
        """Enter ``scope(call)`` (a context manager; ``call`` a ``cp.LiveCall``) around the
        body of each step and decision this ledger's drives run live, in the thread or
        task the body runs in: what it makes current (a span) is current in the body.
        Never entered for a replayed call. A scope that raises is logged, never the
        call's outcome (``runtime/steps/scopes.py``)."""
        self.call_scopes = (*self.call_scopes, scope)

    def on_commit(self, observer: CommitObserver) -> None:
        """Call ``observer(records, fencing_token)`` after each commit of this ledger's
        drives (records of live calls, starts and outcomes; never of a replayed call). An
        observer that raises is logged, never the commit's failure."""
        self.commit_observers = (*self.commit_observers, observer)

    def drive_ended(self, run_id: str, token: int) -> None:
        """The drive of ``run_id`` under ``token`` wrote its last: forget its refusals (a
        new drive claims a new token)."""
        self._stale.discard((run_id, token))
        self._broken.pop((run_id, token), None)

    def _observed(self, events: Sequence[Event], token: int | None) -> None:
        for observer in self.commit_observers:
            try:
                observer(events, token)
            except Exception:
                log.exception("a commit observer failed (the commit stands)")

    def append_records(
        self,
        events: Sequence[Event],
        status: StatusChange | None,
        *,
        fencing_token: int | None = None,
        output: bool | None = None,
    ) -> None:
        """Append to the journal, with crash points on each side of the commit; at an
        output point (runtime/driving/durability.py) the commit is forced to disk first,
        then the new generation is mirrored in the witness (a crash in between is caught
        up by the next resume). ``fencing_token``: the lease the run is driven under; the
        store checks it in the commit's transaction (StaleLeaseError, nothing kept).
        ``output``: whether the last record is an output point, when the caller knows
        (None: output_point decides)."""
        run_id = events[0].run_id
        if self._stale and (run_id, fencing_token) in self._stale:
            raise _stale(run_id, fencing_token)
        if self._broken and (run_id, fencing_token) in self._broken:
            raise _broken(run_id, self._broken[run_id, fencing_token])
        if self.crash_points is not None:
            self._hit("before_commit", events[0])
        # Something leaves the process next?
        durable = output_point(events[-1]) if output is None else output
        try:
            self._store.append(events, status, fencing_token=fencing_token, durable=durable)
            if self.crash_points is not None:
                self._hit("after_commit", events[0])
            if self._witness is not None and durable:
                self._witness.advance(run_id, events[-1].seq + 1)
        except Exception as exc:
            if fencing_token is not None and is_failure(exc):  # a drive's (leased) record
                self._broken[run_id, fencing_token] = exc
            raise
        if self.commit_observers:
            self._observed(events, fencing_token)

    def commit_batch(
        self, groups: Sequence[Sequence[PendingRecord]]
    ) -> list[tuple[int, Exception] | None]:
        """Commit several async drives' pending records (a group per drive, in order) at
        once: in one transaction where the store has ``append_batch`` (SQLite, PostgreSQL), else
        group by group as ``append_records``. Per group: None, or (index, error) of its
        first record not kept; the records before it are kept."""
        if getattr(self._store, "append_batch", None) is None or len(groups) < 2:
            return [self._commit_group(group) for group in groups]
        written = self.write_batch(groups)
        if written.ticket is not None:
            self.wait_durable([written])
        self.conclude_batch(written, range(len(groups)))
        return written.results

    def write_batch(self, groups: Sequence[Sequence[PendingRecord]]) -> WrittenBatch:
        """``commit_batch``'s transaction, without the wait for the disk where the store
        can wait apart (``write_batch``: SQLite): an async loop writes on its own thread
        and only the fsync waits in a thread (runtime/driving/batching.py). Then, per
        group, ``wait_durable`` if it ``waits``, and ``conclude_batch``."""
        appends: list[tuple[RecordAppend, ...]] = []
        refused: list[Exception | None] = []
        for group in groups:
            run_id, token = group[0][0][0].run_id, group[0][2]
            if self._stale and (run_id, token) in self._stale:
                appends.append(())
                refused.append(_stale(run_id, token))
                continue
            if self._broken and (run_id, token) in self._broken:
                appends.append(())
                refused.append(_broken(run_id, self._broken[run_id, token]))
                continue
            appends.append(
                tuple(
                    (events, status, token_, output_point(events[-1]) if out is None else out)
                    for events, status, token_, out in group
                )
            )
            refused.append(None)
        if self.crash_points is not None:
            for records in appends:
                for record in records:
                    self._hit("before_commit", record[0][0])
        batch = [records for records in appends if records]
        write = getattr(self._store, "write_batch", None)
        ticket: object | None = None
        try:
            if write is not None:
                kept_all, ticket = write(batch)
            else:  # the store waits for the disk itself (PostgreSQL: in its statements)
                kept_all = self._store.append_batch(batch)  # type: ignore[attr-defined]
        except Exception as exc:  # the transaction as a whole: every run in it is broken
            self._break(batch, exc)
            raise
        kept = iter(kept_all)
        written = WrittenBatch([], [], ticket)
        for records, refusal in zip(appends, refused, strict=True):
            result = (0, refusal) if refusal is not None else next(kept)
            if result is not None and refusal is None and is_failure(result[1]):
                self._break([records], result[1])
            written.results.append(result)
            written.landed.append(records[: None if result is None else result[0]])
        return written

    def wait_durable(self, batches: Sequence[WrittenBatch]) -> None:
        """Returns once the output points the ``batches`` kept are on disk (a thread's
        wait), and the witness holds them: one forced sync for all (the store's group
        sync shares it further, with the sync shell's drives), and one witness write for
        every run among them (by the sync's leader: ``share_witness_writes``; else here),
        rather than by ``conclude_batch`` on the loop's thread (which finds them made)."""
        waiting = [written for written in batches if written.ticket is not None]
        if not waiting:
            return
        landed = [records for written in waiting for records in written.landed]
        try:
            self._store.wait_durable(*(w.ticket for w in waiting))  # type: ignore[attr-defined]
            many = getattr(self._witness, "advance_many", None)
            if many is not None:
                advances: dict[str, int] = {}
                for records in landed:
                    for events, _status, _token, durable in records:
                        if durable:
                            advances[events[0].run_id] = events[-1].seq + 1
                many(advances)
        except Exception as exc:  # kept, but not known durable: the runs go no further
            self._break(landed, exc)
            raise

    def _break(self, groups: Iterable[Sequence[RecordAppend]], exc: BaseException) -> None:
        """The runs of ``groups`` (one run's records each) take no more records from the
        drives that made them (journal order)."""
        for records in groups:
            if records and records[0][2] is not None:  # a drive's (leased) records
                self._broken[records[0][0][0].run_id, records[0][2]] = exc

    def conclude_batch(self, written: WrittenBatch, groups: Iterable[int]) -> None:
        """After the commit (and, for the groups that wait, the disk): each kept record's
        crash point, the witness advanced for the output points, the observers told."""
        landed = [record for g in groups for record in written.landed[g]]
        if self.crash_points is not None:
            for events, _status, _token, _durable in landed:
                self._hit("after_commit", events[0])
        if self._witness is not None:
            # The runs' output points in one witness write where it takes several
            # (advance_many), before any of them goes on.
            advances = {e[0].run_id: e[-1].seq + 1 for e, _s, _t, durable in landed if durable}
            many = getattr(self._witness, "advance_many", None)
            try:
                if many is not None and len(advances) > 1:
                    many(advances)
                else:
                    for run_id, generation in advances.items():
                        self._witness.advance(run_id, generation)
            except Exception as exc:  # the next resume catches the witness up
                self._break([written.landed[g] for g in groups], exc)
                raise
        if self.commit_observers:
            for events, _status, token, _durable in landed:
                self._observed(events, token)

    def _commit_group(self, group: Sequence[PendingRecord]) -> tuple[int, Exception] | None:
        for index, (events, status, token, out) in enumerate(group):
            try:
                self.append_records(events, status, fencing_token=token, output=out)
            except Exception as exc:
                return index, exc
        return None

    def _hit(self, side: str, event: Event) -> None:
        points = self.crash_points
        if points is not None:
            label = event.type.value if event.key is None else f"{event.type.value}:{event.key}"
            points.hit(f"{side}[{label}]")


def _broken(run_id: str, cause: BaseException) -> LedgerError:
    return LedgerError(
        f"run {run_id!r}: an earlier record of this drive failed to commit ({cause}); "
        "nothing more is written by it (journal order), a resume goes on from what landed"
    )


def _stale(run_id: str, token: int | None) -> StaleLeaseError:
    return StaleLeaseError(
        f"run {run_id!r}: this worker's lease (fencing token {token}) was lost to another "
        "worker; nothing more is written"
    )
