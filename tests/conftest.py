"""Fixtures shared by the unit and contract suites: ledgers on a temporary SQLite file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

LedgerFactory = Callable[..., cp.Ledger]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def open_ledger(db_path: Path) -> Iterator[LedgerFactory]:
    """Open Ledger objects (by default on ``db_path``); all are closed at teardown.

    Each call returns a NEW Ledger object, as a restarted process would have.
    """
    opened: list[cp.Ledger] = []

    def factory(url: str | None = None, **kwargs: Any) -> cp.Ledger:
        ledger = cp.Ledger(url or f"sqlite:///{db_path}", **kwargs)
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()
