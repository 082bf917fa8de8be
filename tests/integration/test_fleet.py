"""A fleet with nobody at the keyboard (issue 38, DESIGN.md section 15), bounded for
``make test``: four worker processes, workers SIGKILLed at random and restarted, the model
server down longer than the retry budget, the outbox receiver down while runs end, and on
PostgreSQL the database stopped for a few seconds. Every run finishes with no command
typed, no effect duplicated or lost, no decision asked again. ``make chaos`` runs the
long version (FLEET_RUNS, FLEET_KILLS, FLEET_SEED).

SQLite has no server to stop: its "database stopped" would be the file made unavailable,
which on one host is a disk fault (tests/integration/test_storage_faults.py), not an
outage a worker waits out. So the SQLite fleet gets worker kills, the model outage and
the receiver outage; the PostgreSQL fleet gets the database restart too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from integration.fleet import Fleet, judge

SEED = int(os.environ.get("FLEET_SEED", "38"))
RUNS = int(os.environ.get("FLEET_RUNS", "12"))
KILLS = int(os.environ.get("FLEET_KILLS", "4"))


def test_a_sqlite_fleet_finishes_every_run_with_nobody_at_the_keyboard(tmp_path: Path) -> None:
    fleet = Fleet(f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path, SEED, RUNS, kills=KILLS)
    report = judge(fleet, fleet.run())
    print(json.dumps(report, indent=1))
    assert report["takeovers_of_dead_workers"] >= 1 or KILLS == 0
    assert report["automatic_retries_of_stopped_runs"] >= 1
    assert report["outbox_delivered_by_workers"] >= 1


@pytest.fixture
def own_pg() -> object:
    """A PostgreSQL cluster of this test's own: it is stopped mid-test."""
    import postgres_server

    server = postgres_server.PostgresServer(postgres_server.require_bindir())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_postgres_fleet_finishes_every_run_through_a_database_restart(
    tmp_path: Path, own_pg: object
) -> None:
    url = own_pg.create_database()  # type: ignore[attr-defined]
    fleet = Fleet(url, tmp_path, SEED, RUNS, kills=KILLS, restart=own_pg.restart)  # type: ignore[attr-defined]
    report = judge(fleet, fleet.run())
    print(json.dumps(report, indent=1))
    assert any("database stop" in fault for fault in report["faults"])
    assert report["takeovers_of_dead_workers"] >= 1 or KILLS == 0
    assert report["automatic_retries_of_stopped_runs"] >= 1
    assert report["outbox_delivered_by_workers"] >= 1
