"""A store failure is never an outcome (DESIGN.md §11 invariant 8, #38 part 1): a real
database error at every statement the store runs for a run, on SQLite and on
PostgreSQL, in the sync and the async shell (where many runs' records share a batch).

For each statement k: the drive that met the failure raises ``LedgerError`` and writes
nothing more, so every run's journal is a prefix of the same run without faults (no
record committed after a failed one, no store error journaled as a call's failure);
then a resume finishes every run with the clean result, one effect per operation id,
no call recorded twice and nothing frozen (an act whose intent landed is looked up, a
decision whose record was lost is asked again). Faults: ``_store_faults.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

from ._store_faults import (
    Agent,
    Book,
    PostgresFault,
    SqliteFault,
    check_finished,
    check_prefix,
    run_all,
    shape,
)

SHELLS = pytest.mark.parametrize("shell", ["sync", "async"])
ASYNC_RUNS = 3  # the async shell's runs per fault: their records share batches


def _runs(shell: str, k: int) -> list[str]:
    return [f"r{k}"] if shell == "sync" else [f"r{k}-{i}" for i in range(ASYNC_RUNS)]


def _sweep(ledger: cp.Ledger, shell: str, arm: Any, passed: Any) -> int:
    """Fail statement k = 1, 2, ... of fresh runs until a drive passes them all; check
    each k as the module docstring says. Returns how many statements were failed."""
    agent = Agent(ledger, Book())
    arm(0)
    clean_runs = _runs(shell, 0)
    clean = run_all(ledger, agent, shell, clean_runs)
    check_finished(ledger, agent, clean, lambda run: clean[clean_runs[0]])
    reference = shape(ledger, clean_runs[0])
    total = passed()
    assert total > 10, total
    failed = 0
    for k in range(1, total + 1):
        runs = _runs(shell, k)
        arm(k)
        first = run_all(ledger, agent, shell, runs)
        arm(0)
        errors = [r for r in first.values() if isinstance(r, BaseException)]
        for error in errors:  # the ledger's failure, told as such: never a run's outcome
            assert isinstance(error, cp.LedgerError), repr(error)
        failed += bool(errors)
        for run in runs:
            check_prefix(shape(ledger, run), reference, run, k)
        again = run_all(ledger, agent, shell, runs)
        check_finished(ledger, agent, again, lambda run: clean[clean_runs[0]])
    return failed


@SHELLS
def test_sqlite_fails_at_every_statement_and_every_run_finishes(tmp_path: Path, shell: str) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", lease_seconds=600) as ledger:
        fault = SqliteFault(ledger.store)
        failed = _sweep(ledger, shell, fault.arm, lambda: fault.count)
    assert failed > 5  # the faults reached the drives, not only retried statements


@SHELLS
def test_postgres_fails_at_every_statement_and_every_run_finishes(
    pg_server: Any, pg_url: str, shell: str
) -> None:
    with cp.Ledger(pg_url, lease_seconds=600) as ledger:
        fault = PostgresFault(pg_server, pg_url)
        failed = _sweep(ledger, shell, fault.arm, fault.count)
    assert failed > 5


@SHELLS
def test_a_workflow_that_swallows_the_failure_still_writes_nothing_more(
    tmp_path: Path, shell: str
) -> None:
    """Even ``except BaseException`` around a call whose commit failed: the drive's next
    ctx call raises again, its return records nothing, and the caller gets LedgerError."""
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", lease_seconds=600) as ledger:
        book = Book()

        @ledger.workflow("greedy", version="1")
        def greedy(ctx: cp.Context) -> str:
            ctx.step("a", lambda: 1)
            with contextlib.suppress(BaseException):  # the point of the test
                ctx.act("pay", book, to=ctx.run_id)
            with contextlib.suppress(BaseException):  # the point of the test
                ctx.step("b", lambda: 2)
            return "swallowed"

        @ledger.workflow("greedy_async", version="1")
        async def greedy_async(ctx: cp.AsyncContext) -> str:
            await ctx.step("a", lambda: 1)
            with contextlib.suppress(BaseException):  # the point of the test
                await ctx.act("pay", book, to=ctx.run_id)
            with contextlib.suppress(BaseException):  # the point of the test
                await ctx.step("b", lambda: 2)
            return "swallowed"

        def drive(run: str) -> Any:
            try:
                if shell == "sync":
                    return ledger.run(greedy, run_id=run)
                return asyncio.run(ledger.run_async(greedy_async, run_id=run))
            except cp.LedgerError as exc:
                return exc

        fault = SqliteFault(ledger.store)
        fault.arm(0)
        assert drive("r0") == "swallowed"
        reference, total = shape(ledger, "r0"), fault.count
        failed = 0
        for k in range(1, total + 1):
            fault.arm(k)
            first = drive(f"r{k}")
            fault.arm(0)
            failed += isinstance(first, cp.LedgerError)
            check_prefix(shape(ledger, f"r{k}"), reference, f"r{k}", k)
            assert drive(f"r{k}") == "swallowed"
            assert book.effects[f"r{k}/pay"] == 1
        assert failed > 3
