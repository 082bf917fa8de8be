"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against
CrashproofSaver, on SQLite and on PostgreSQL: every base and extended capability."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from crashproof.integrations.langgraph import CrashproofSaver

_ALL = 81  # base 58 + extended 23 in langgraph-checkpoint-conformance 0.0.2


def _summary(report: Any) -> tuple[int, int, list[str]]:
    passed = sum(r.tests_passed for r in report.results.values())
    failed = sum(r.tests_failed for r in report.results.values())
    failures = [f for r in report.results.values() for f in (r.failures or [])]
    return passed, failed, failures


async def test_conformance_on_sqlite(tmp_path: Path) -> None:
    counter = itertools.count()

    @checkpointer_test(name="CrashproofSaver[sqlite]")
    async def factory() -> AsyncIterator[CrashproofSaver]:
        saver = CrashproofSaver(f"sqlite:///{tmp_path / f'ledger-{next(counter)}.db'}")
        yield saver
        saver.close()

    report = await validate(factory, progress=ProgressCallbacks.quiet())
    report.print_report()
    passed, failed, failures = _summary(report)
    assert (passed, failed) == (_ALL, 0), failures


async def test_conformance_on_postgres(pg_server: Any) -> None:
    @checkpointer_test(name="CrashproofSaver[postgres]")
    async def factory() -> AsyncIterator[CrashproofSaver]:
        saver = CrashproofSaver(pg_server.create_database())
        yield saver
        saver.close()

    report = await validate(factory, progress=ProgressCallbacks.quiet())
    report.print_report()
    passed, failed, failures = _summary(report)
    assert (passed, failed) == (_ALL, 0), failures
