"""Fixtures shared by the suites: ledgers on a temporary SQLite file, and PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

LedgerFactory = Callable[..., cp.Ledger]

# Every ledger the suite opens (and every child process it starts) seals its journal
# with this key, so no test writes a key file into the user's config directory.
TEST_KEY = "5e" * 32
os.environ.setdefault("CRASHPROOF_KEY", TEST_KEY)


@pytest.fixture(params=["native", "python"])
def seal_implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every Sealer made in this process during the test seals natively (integrity/
    _seal.c; skipped where it is not built), or in Python as an install without it does.
    Use it with ``pytestmark = pytest.mark.usefixtures("seal_implementation")``."""
    from crashproof.integrity import seal

    if request.param == "native" and not seal.NATIVE:
        pytest.skip("the native seal is not built here")
    if request.param == "python":
        monkeypatch.setattr(seal, "_native", None)
    return str(request.param)


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


# -- PostgreSQL: one throwaway server per session, a fresh database per test ------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A PostgreSQL server started for this session (see tests/postgres_server.py).

    Skips locally, fails in CI, when the server binaries are missing."""
    import postgres_server  # imported here: only the PostgreSQL tests need psycopg

    server = postgres_server.PostgresServer(postgres_server.require_bindir())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server."""
    url: str = pg_server.create_database()
    return url
