"""The drive's edge (runtime/driving/commits.py): the ledger's failure, raised through
the workflow as ``StoreFailed``, reaches the caller as one ``LedgerError`` naming the run,
also when a framework's task group wrapped it; anything else passes unchanged."""

from __future__ import annotations

import asyncio

import pytest

import crashproof as cp
from crashproof.runtime.driving.commits import StoreFailed, store_edge


def test_a_store_failure_becomes_a_ledger_error_naming_the_run() -> None:
    cause = cp.LedgerError("server closed the connection unexpectedly")
    with pytest.raises(cp.LedgerError, match=r"run 'r'.*resumable") as caught, store_edge("r"):
        raise StoreFailed("r", cause)
    assert caught.value.__cause__ is cause


def test_a_store_failure_in_a_task_group_is_found() -> None:
    async def boom() -> None:
        raise StoreFailed("r", OSError("disk"))

    async def grouped() -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(boom())

    with pytest.raises(cp.LedgerError, match=r"run 'r'.*\(disk\)"), store_edge("r"):
        asyncio.run(grouped())


def test_other_errors_pass_unchanged() -> None:
    with pytest.raises(ExceptionGroup), store_edge("r"):
        raise ExceptionGroup("x", [ValueError("v")])
    with pytest.raises(KeyError), store_edge("r"):
        raise KeyError("k")
