"""The run index and liveness reads of the PostgreSQL store: the console's and the CLI's
listings (crashproof.store.index) and each run's lease (crashproof.store.queue).

A mixin of ``PostgresStore``: read-only, each read one autocommit statement (one snapshot),
the SQL in store/sql/postgres/queries.sql as the rest of the store's.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from crashproof.journal.codec import decode
from crashproof.journal.records import RunRow, RunStatus
from crashproof.store.index import IndexQuery
from crashproof.store.queue import LeaseInfo

__all__ = ["PostgresIndex", "run_row"]

Cursor = psycopg.Cursor[tuple[Any, ...]]


class PostgresIndex:
    """The listing half of PostgresStore."""

    _q: dict[str, str]

    def _read(self) -> contextlib.AbstractContextManager[Cursor]:
        raise NotImplementedError  # provided by PostgresStore

    def index_page(self, query: IndexQuery, offset: int, limit: int) -> tuple[list[RunRow], int]:
        params = {**query.params(), "offset": max(0, offset), "limit": limit}
        with self._read() as cur:
            rows = cur.execute(self._q["index_page"], params).fetchall()
            found = cur.execute(self._q["index_count"], query.params()).fetchone()
        return [run_row(r) for r in rows], 0 if found is None else int(found[0])

    def index_summary(self) -> tuple[dict[str, int], list[str]]:
        with self._read() as cur:
            rows = cur.execute(self._q["index_summary"]).fetchall()
        counts: dict[str, int] = {}
        for status, _, n in rows:
            counts[status] = counts.get(status, 0) + int(n)
        return counts, sorted({workflow for _, workflow, _ in rows})

    def index_marks(self) -> list[tuple[str, str, float]]:
        with self._read() as cur:
            rows = cur.execute(self._q["index_marks"]).fetchall()
        return [(run_id, status, float(updated)) for run_id, status, updated in rows]

    def index_outbox_runs(self) -> set[str]:
        with self._read() as cur:
            return {r[0] for r in cur.execute(self._q["index_outbox_runs"]).fetchall()}

    def index_reconciled_runs(self) -> set[str]:
        with self._read() as cur:
            return {r[0] for r in cur.execute(self._q["index_reconciled_runs"]).fetchall()}

    def leases(self) -> dict[str, LeaseInfo]:
        with self._read() as cur:
            rows = cur.execute(self._q["leases"]).fetchall()
        return {
            run_id: LeaseInfo(owner, expires, int(token), retry_at, int(retries))
            for run_id, owner, expires, token, retry_at, retries in rows
        }


def run_row(found: Any) -> RunRow:
    """A RunRow from a runs-table row (run_id, workflow, version, status, reason, input
    digest, created, updated)."""
    run_id, workflow, version, status, reason, input_digest, created_at, updated_at = found
    return RunRow(
        run_id=run_id,
        workflow=workflow,
        version=version,
        status=RunStatus(status),
        reason=None if reason is None else decode(reason),
        input_digest=input_digest,
        created_at=created_at,
        updated_at=updated_at,
    )
