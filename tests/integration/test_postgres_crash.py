"""Real PostgreSQL server crashes under load (#38 part 1, DESIGN.md §11 invariant 8):
``pg_ctl stop -m immediate`` while dozens of runs are in flight (async: on one loop,
their commits batched; sync: a thread each), then a restart. Every drive that met the
crash raises ``LedgerError`` and writes nothing more (each run's journal is a prefix of
the run without faults); every run passes ``check`` (none refused: ``WitnessMissing``,
``JournalRolledBack``); resuming them all, with the server back, finishes every run:
0 stuck, 0 frozen as non-determinism, 0 effects duplicated, 0 lost.

The witness is the real PostgreSQL one (integrity/pg_witness.py), in two places:

- ``same``: its default schema in the ledger's cluster, crashed with it;
- ``apart``: another server (``witness_url``, the stronger choice), crashed at the same
  moment. There its writes have a WAL of their own: written with ``synchronous_commit``
  off, a crash lost new runs' rows whose journals were durable, and those runs were
  refused (``WitnessMissing``) until an operator re-anchored them.

Bounded here (``CRASHES`` x ``RUNS``, seeded); ``make chaos`` runs the long version
(CRASHPROOF_PG_CRASHES=7). The servers are this module's own: crashing the session's
would break the other tests' databases.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from traceback import format_exception
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity.pg_witness import PostgresWitness

from ._store_faults import Agent, Book, check_finished, check_prefix, run_all, shape

pytest.importorskip("psycopg")

CRASHES = int(os.environ.get("CRASHPROOF_PG_CRASHES", "2"))
RUNS = int(os.environ.get("CRASHPROOF_PG_CRASH_RUNS", "50"))
SEED = int(os.environ.get("CRASHPROOF_PG_CRASH_SEED", "38"))


def own_server() -> Iterator[Any]:
    import postgres_server

    server = postgres_server.PostgresServer(postgres_server.require_bindir())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def crashing_server() -> Iterator[Any]:
    yield from own_server()


@pytest.fixture(scope="module")
def witness_server() -> Iterator[Any]:
    """The witness's own server, for ``apart``."""
    yield from own_server()


class Crasher:
    """Crashes the servers once the agents' steps have run ``after`` times (mid-load),
    keeps them down ``down`` seconds, and starts them again."""

    def __init__(self, servers: list[Any], after: int, down: float) -> None:
        self._servers = servers
        self._after = after
        self._down = down
        self._steps = 0
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._thread = threading.Thread(target=self._crash, name="pg-crasher")
        self._thread.start()

    def tick(self) -> None:
        with self._lock:
            self._steps += 1
            if self._steps == self._after:
                self._due.set()

    def _crash(self) -> None:
        if not self._due.wait(timeout=120):
            return  # the runs ended first: the caller finds no drive failed
        crashes = [threading.Thread(target=server.crash) for server in self._servers]
        for crash in crashes:  # at the same moment, as one power strip
            crash.start()
        for crash in crashes:
            crash.join()
        time.sleep(self._down)
        for server in self._servers:
            server.restart()

    def join(self) -> bool:
        """Whether the crash came mid-load (else it comes now: the server is back after)."""
        mid_load = self._due.is_set()
        self._due.set()
        self._thread.join()
        return mid_load


@pytest.mark.parametrize(
    ("shell", "place"), [("sync", "apart"), ("async", "apart"), ("async", "same")]
)
def test_postgres_crashes_under_load_leave_no_run_stuck(
    crashing_server: Any, witness_server: Any, shell: str, place: str
) -> None:
    rng = random.Random(SEED)
    # A schema per case (the module's servers outlive each case); "same": the default
    # witness, schema <ledger schema>_witness in the ledger's cluster.
    url = crashing_server.url("postgres") + f"?schema=l_{shell}_{place}"
    servers = [crashing_server]
    witness = None
    if place == "apart":
        servers.append(witness_server)
        witness = PostgresWitness(witness_server.url("postgres"), schema=f"w_{shell}")
    crasher: Crasher | None = None
    book = Book()
    failed_drives = []
    with cp.Ledger(url, lease_seconds=600, witness=witness) as ledger:
        if place == "same":
            assert isinstance(ledger.witness, PostgresWitness)
        agent = Agent(ledger, book, pause=0.0, tick=lambda: crasher and crasher.tick())
        clean = run_all(ledger, agent, shell, [f"{shell}-{place}-clean"])
        check_finished(ledger, agent, clean, lambda run: clean[f"{shell}-{place}-clean"])
        reference = shape(ledger, f"{shell}-{place}-clean")
        # CRASHES crashes, and more (up to 3) while none has hit a drive in flight: a
        # crash between statements only delays the runs and would prove nothing.
        for crash in range(CRASHES + 3):
            if crash >= CRASHES and sum(failed_drives) > 0:
                break
            runs = [f"{shell}-{place}-c{crash}-{i}" for i in range(RUNS)]
            # Two steps a run: crash once between a tenth and half of them ran.
            crasher = Crasher(servers, rng.randint(RUNS // 5, RUNS), rng.uniform(0.2, 1.5))
            first = run_all(ledger, agent, shell, runs)
            assert crasher.join(), "the runs ended before the crash"
            crasher = None
            errors = [r for r in first.values() if isinstance(r, BaseException)]
            for error in errors:  # the ledger's failure, told as such
                assert isinstance(error, cp.LedgerError), "".join(format_exception(error))
            failed_drives.append(len(errors))
            # None refused (a witness row lost while the journal kept the run: the
            # WitnessMissing of #38), before anything resumes them.
            refused = {run: why for run, why in ledger.check() if run in runs and why}
            assert not refused, refused
            for run in runs:  # nothing committed after a failed record
                check_prefix(shape(ledger, run), reference, run, crash)
            again = run_all(ledger, agent, shell, runs)  # resumed with the servers back
            check_finished(ledger, agent, again, lambda run: clean[f"{shell}-{place}-clean"])
        assert not [why for _, why in ledger.check() if why]
    # The crashes hit drives in flight (else this proves nothing; a crash between
    # statements only delays them).
    assert sum(failed_drives) > 0, failed_drives
    print(f"{shell}/{place}: {len(failed_drives)} crashes x {RUNS} runs, failed: {failed_drives}")
