"""Output-triggered durability: which journal records must be durable before their
commit returns, because something leaves the process right after them.

"Rethink the Sync" (Nightingale et al., OSDI 2006): durability only has to hold for what
an outside observer can see. A commit must reach the disk before any output that depends
on it is externalised, not before. For a run the outputs are known exactly:

- an act's intent (``act_intent``): the tool executes right after it commits. If the
  intent were lost after the effect, recovery would not know to look the effect up and
  would do it again;
- a run's outcome (``run_succeeded``, ``run_failed``, ``run_frozen`` — including an
  approval request — and ``run_stopped``): ``run``/``resume`` hand it back right after;
- an outbox message (a ``step_done`` carrying ``outbox``): its delivery follows;
- a move (``run_moved``): the checkpoint document leaves the process next (an export).

Every other record (a local step, a model's decision, a receipt, a failed attempt) rides
in the write-ahead log unsynced. Losing it in a power cut is indistinguishable from a
crash just before it: the step runs again, the decision is asked again, the receipt is
looked up again, and nothing outside ever saw the difference. One forced sync covers
every earlier record of the log, so the journal stays a prefix of what was written.

The generation witness advances only after such a sync, so it is never ahead of what a
power cut leaves on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType
from crashproof.runtime.port import PendingRecord
from crashproof.store.port import StatusChange

__all__ = ["OUTCOMES", "Pending", "local_commits", "output_point", "share_witness_writes"]

OUTCOMES = frozenset(
    {
        EventType.RUN_SUCCEEDED,
        EventType.RUN_FAILED,
        EventType.RUN_FROZEN,
        EventType.RUN_STOPPED,
        EventType.RUN_MOVED,  # the checkpoint document leaves the process next
    }
)

# A deliberately WRONG variant, for the power-cut verifier's own test only: an act's
# intent is not synced before the tool executes. Never set it outside that test.
_UNSAFE_SKIP_INTENT_SYNC = False


def output_point(event: Event) -> bool:
    """Whether something leaves the process right after ``event`` commits: its commit
    (and every earlier one) must be durable first, and the witness may advance."""
    type_ = event.type
    if type_ is _STEP_DONE:  # the usual record first: it runs for every journal commit
        return "outbox" in payloads.step_done(event)
    if type_ is _ACT_INTENT:
        return not _UNSAFE_SKIP_INTENT_SYNC
    return type_ in OUTCOMES


_STEP_DONE = EventType.STEP_DONE
_ACT_INTENT = EventType.ACT_INTENT


def local_commits(url: str, durability: str) -> bool:
    """Whether a commit that is no output point waits for nothing but this process's own
    work (a SQLite or in-memory ledger short of "full" durability): an async drive makes
    it on the loop's thread, never a thread hop (runtime/driving/batching.py). Not for a
    database server (a round trip), nor where every commit is synced."""
    return durability != "full" and not url.startswith(("postgresql:", "postgres:"))


def share_witness_writes(store: Any, witness: Any) -> None:
    """Let the store's group sync advance the witness once for every run it made durable
    (``SQLiteStore.on_durable`` -> ``SQLiteWitness.advance_many``), right after the sync
    and before any of them goes on: concurrent runs then share one witness write, and
    each run's own advance (``Ledger._commit``) finds it made. Stores or witnesses
    without these hooks keep advancing one run at a time."""
    hook = getattr(witness, "advance_many", None)
    if hook is not None and hasattr(store, "on_durable"):
        store.on_durable = hook


class Pending:
    """An async drive's records, committed before its next handoff: the event loop never
    waits on a commit, and a record is committed before anything depending on it leaves
    the process (a crash before then loses it, as a crash before its commit would). Each
    is committed with the crash points and durability the sync shell gives it
    (``commits.py``)."""

    def __init__(self, local: bool) -> None:
        self.local = local  # the journal is on this machine: a commit is no round trip
        self._records: list[tuple[Sequence[Event], StatusChange | None, bool | None]] = []

    def __bool__(self) -> bool:
        return bool(self._records)

    def add(
        self, events: Sequence[Event], status: StatusChange | None, output: bool | None
    ) -> None:
        self._records.append((events, status, output))

    def must_sync(self) -> bool:
        """A pending record is an output point: its commit waits for the disk."""
        return any(
            output_point(events[-1]) if output is None else output
            for events, _, output in self._records
        )

    def take(self, fencing_token: int | None) -> list[PendingRecord]:
        """The records, in order, for one commit; none are pending afterwards."""
        records, self._records = self._records, []
        return [(events, status, fencing_token, output) for events, status, output in records]
