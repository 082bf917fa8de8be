"""The run index as a console reads it: a page of index rows, counts, and marks.

A console (``crashproof ui``, ``runtime/operations/browse.py``) shows a page of runs out
of many thousands; reading every index row for it (``Store.list_runs``) costs about
30 us a row on SQLite (10,000 runs: 280 ms). These reads let the store filter, sort and
page itself. Runs under the reserved ``crashproof:`` prefix (the approvers registry)
are never part of them. Every shipped store (memory, SQLite, PostgreSQL) implements
this protocol beside the ``Store`` port; ``run_index`` returns None for one that does not
(the reader then falls back to ``list_runs``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from crashproof.journal.records import RunRow, RunStatus

__all__ = ["RESERVED_PREFIX", "IndexQuery", "OutboxIndex", "RunIndex", "outbox_index", "run_index"]

RESERVED_PREFIX = "crashproof:"  # runtime/guards/approvers.py: the ledger's own runs


class IndexQuery:
    """Which index rows a page shows: exact ``status`` and ``workflow``, ``search`` a
    substring of the run id, last updated at or after ``since`` and before ``until``
    (epoch seconds) (each None: any)."""

    __slots__ = ("search", "since", "status", "until", "workflow")

    def __init__(
        self,
        status: RunStatus | None = None,
        workflow: str | None = None,
        search: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> None:
        self.status, self.workflow, self.search = status, workflow or None, search or None
        self.since, self.until = since, until

    def matches(self, row: RunRow) -> bool:
        return (
            not row.run_id.startswith(RESERVED_PREFIX)
            and (self.status is None or row.status is self.status)
            and (self.workflow is None or row.workflow == self.workflow)
            and (self.search is None or self.search in row.run_id)
            and (self.since is None or row.updated_at >= self.since)
            and (self.until is None or row.updated_at < self.until)
        )

    def params(self) -> dict[str, str | float | None]:
        return {
            "status": None if self.status is None else self.status.value,
            "workflow": self.workflow,
            "search": self.search,
            "since": self.since,
            "until": self.until,
        }


@runtime_checkable
class RunIndex(Protocol):
    def index_page(self, query: IndexQuery, offset: int, limit: int) -> tuple[list[RunRow], int]:
        """The rows ``query`` matches, newest ``updated_at`` first (then by run id),
        ``limit`` of them from ``offset``, and how many match in all."""
        ...

    def index_summary(self) -> tuple[dict[str, int], list[str]]:
        """How many runs have each status (statuses with none left out), and every
        workflow name, sorted."""
        ...

    def index_marks(self) -> list[tuple[str, str, float]]:
        """(run id, status, updated_at) of every run: what changes whenever a status
        change is journaled."""
        ...


def run_index(store: object) -> RunIndex | None:
    return store if isinstance(store, RunIndex) else None


@runtime_checkable
class OutboxIndex(Protocol):
    def index_outbox_runs(self) -> set[str]:
        """The ids of the runs whose journal has an outbox message (a ``step_done``
        whose stored payload names ``"outbox"``), delivered or not: one scan of the
        journal table instead of every journal verified and folded. A text test on
        unverified rows, so only a filter: the reader verifies and folds the journals
        it names before it shows anything of them."""

    def index_reconciled_runs(self) -> set[str]:
        """The ids of the runs with a journaled reconciliation finding (``act_reconciled``
        records), a filter as ``index_outbox_runs`` is."""
        ...


def outbox_index(store: object) -> OutboxIndex | None:
    return store if isinstance(store, OutboxIndex) else None
