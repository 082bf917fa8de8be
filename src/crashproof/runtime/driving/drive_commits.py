"""One drive's side of its commits (a mixin of ``Context``): each record committed at
once (the sync shell) or kept until the drive's next handoff (the async shell,
``durability.Pending``, committed alone or in a batch: ``batching.py``); a refusal
(``IntentHeld``, a lost lease) handed back with the drive's seq rewound to the refused
record; and a failure of the ledger stopping the drive for good (``store_failed``).

Journal order (DESIGN.md §11 invariant 8, ``commits.py``): once a commit of the drive
failed, its outcome unknown, the drive writes and runs nothing more. Every later record
and ctx call raises ``StoreFailed`` again, even where a recorder or the user's code
caught the first one.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from crashproof.journal.records import Event
from crashproof.runtime.driving.commits import StoreFailed, is_failure
from crashproof.runtime.driving.durability import Pending, local_commits
from crashproof.runtime.port import DriveHost, PendingRecord
from crashproof.store.port import StatusChange

__all__ = ["DriveCommits"]

log = logging.getLogger(__name__)


class DriveCommits:
    _host: DriveHost
    _next_seq: int
    run_id: str
    fencing_token: int | None
    ended: bool  # the run's outcome is committed: its lease went with it
    # The error of the ledger that broke this drive's journal (``store_failed``).
    broken: BaseException | None
    # An async drive's records, committed before its next handoff (Pending); None:
    # committed at once (the sync shell).
    pending: Pending | None
    session: dict[str, Any] | None  # put in the drive's first record

    def _commit(
        self, events: tuple[Event, ...], status: StatusChange | None, out: bool | None
    ) -> None:
        if self.broken is not None:  # even where a recorder or the user caught StoreFailed
            self.store_failed(self.broken)
        if self.pending is not None:  # an async drive: committed before its next handoff
            return self.pending.add(events, status, out)
        try:
            self._host.append_records(events, status, fencing_token=self.fencing_token, output=out)
        except Exception as exc:
            if is_failure(exc):
                self.store_failed(exc)
            raise
        if status is not None and status[0].terminal:
            self.ended = True

    def store_failed(self, cause: BaseException) -> NoReturn:
        """The ledger failed under this drive (a commit whose outcome is unknown, a
        read): stop it. Nothing more is written or run by it (journal order, DESIGN.md
        §11 invariant 8); ``StoreFailed`` passes every ``except Exception`` of the
        recorders and of the user's code, and the ledger raises a ``LedgerError`` to
        its caller. The run is left as a crash at this point would leave it."""
        if self.broken is None:
            self.broken = cause
            log.warning(
                "the ledger failed; this drive stops (resumable): %s",
                cause,
                extra={"run_id": self.run_id},
            )
        raise StoreFailed(self.run_id, self.broken)

    def buffer_commits(self) -> None:  # the async shell: committed before each handoff
        self.pending = Pending(local=local_commits(self._host.url, self._host.durability))

    def flush(self) -> None:
        """Commit what an async drive made since its last handoff (``Pending``)."""
        if self.pending:
            group = self.take_commits()
            try:
                result = self._host.commit_batch([group])[0]
            except Exception as exc:  # the commit as a whole
                self.store_failed(exc)
            self.committed(group, result)

    def take_commits(self) -> list[PendingRecord]:
        """The records to commit (``flush``, or a batch: runtime/driving/batching.py)."""
        return [] if self.pending is None else self.pending.take(self.fencing_token)

    def committed(self, group: list[PendingRecord], result: tuple[int, Exception] | None) -> None:
        """A refused record (and those after it) not kept: go on from its seq, and raise."""
        # The run's outcome is its drive's last record: only the last one kept can be it.
        kept = len(group) if result is None else result[0]
        status = group[kept - 1][1] if kept else None
        if status is not None and status[0].terminal:
            self.ended = True
        if result is not None and is_failure(result[1]):
            self.store_failed(result[1])
        if result is not None:
            refused = group[result[0]][0][0]
            self._next_seq = refused.seq
            self.session = self.session or refused.payload.get("session")
            raise result[1]
