"""A worker whose drive PostgreSQL cut off (the server crashed mid-statement, then came
back) takes the run back by itself, on the schedule of a retryable stop, and finishes
it (#38). A store out is a retryable cause: before, the worker left the run alone for
its fixed 5 s back-off for bugs, doubling, whatever ``retry_first`` said."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import crashproof as cp
from crashproof.runtime.worker import Worker

WAIT = 60.0  # generous on a loaded machine; never reached when green


@pytest.fixture
def server() -> Iterator[Any]:
    """A server of this test's own: it is crashed and restarted."""
    import postgres_server

    own = postgres_server.PostgresServer(postgres_server.require_bindir())
    try:
        own.start()
        yield own
    finally:
        own.stop()


def wait_until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_worker_takes_its_run_back_once_postgres_restarted(server: Any) -> None:
    url = server.create_database()
    gate = threading.Event()
    ran: list[str] = []

    @cp.workflow("restarted")
    def restarted(ctx: cp.Context, n: int) -> str:
        ctx.step("before", lambda: ran.append("before"))
        ctx.step("held", lambda: ran.append("held") or gate.wait(WAIT))
        return str(ctx.step("after", lambda: f"done {n}"))

    ledger = cp.Ledger(url, key="42" * 32)
    ledger.lease_seconds = 1.0  # the failed drive's release fails too: its lease runs out
    ledger.register(restarted)
    ledger.enqueue(restarted, run_id="r", n=1)
    log = io.StringIO()
    worker = Worker(ledger, poll=0.02, log=log, retry_first=0.3, retry_max=0.6)
    serving = threading.Thread(target=worker.serve, daemon=True)
    serving.start()
    try:
        wait_until("the drive to reach the held step", lambda: "held" in ran)
        # Hold the run's index row, so that the step's record waits in the server: the
        # crash then cuts a statement in flight (else a fresh connection would take it).
        blocker = psycopg.connect(url)
        blocker.execute("SELECT 1 FROM crashproof.runs WHERE run_id = 'r' FOR UPDATE")
        gate.set()
        admin = psycopg.connect(url, autocommit=True)
        wait_until(
            "the step's record to wait on the row",
            lambda: bool(
                admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchall()
            ),
        )
        admin.close()
        server.crash()
        blocker.close()
        server.restart()
        wait_until("the run to end", lambda: ledger.get_run("r").status.terminal)
        wait_until("the worker to log it", lambda: '"succeeded"' in log.getvalue())
    finally:
        worker.stop()
        serving.join(WAIT)
        ledger.close()
    assert ledger_result(url, "r") == "done 1"
    seen = [json.loads(line) for line in log.getvalue().splitlines()]
    errors = [e for e in seen if e["event"] == "error"]
    assert errors, seen  # the crash did cut the drive off
    assert all(e.get("store") is True for e in errors)
    assert errors[0]["retry_in"] == pytest.approx(0.3)  # retry_first, not the 5 s for bugs
    claims = [e for e in seen if e["event"] == "claimed"]
    assert len(claims) >= 2  # taken back by the same worker, with nobody's help
    assert [e["event"] for e in seen if e.get("run_id") == "r"][-1] == "succeeded"


def ledger_result(url: str, run_id: str) -> Any:
    with cp.Ledger(url, key="42" * 32) as ledger:
        return ledger.get_run(run_id).result


def test_a_run_failing_again_after_its_back_off_waits_twice_as_long() -> None:
    """The back-off doubles from one failure to the next: the first wait is remembered
    past its end (it was forgotten as soon as it ended, so it never doubled)."""
    with cp.Ledger("memory://") as ledger:
        worker = Worker(ledger, log=io.StringIO(), retry_first=0.1, retry_max=0.3)
        first = worker._back_off("r", worker.retry_first, worker.retry_max)
        time.sleep(0.15)  # its wait is over: the run may be claimed again ...
        assert worker._claim([]) is None
        second = worker._back_off("r", worker.retry_first, worker.retry_max)  # ... and failed
        third = worker._back_off("r", worker.retry_first, worker.retry_max)
        assert (first, second, third) == (0.1, 0.2, 0.3)  # at most retry_max


def test_enqueues_and_claims_survive_a_postgres_crash_right_after(server: Any) -> None:
    """``enqueue`` and a claim returned, then the server crashed: both are there after.
    Both were committed unsynced (``output`` durability) and ``sync()`` flushed nothing,
    so a crash before the WAL writer's next flush lost them: an enqueued run was gone (a
    worker had nothing to claim, a chaos trial waited for it until its limit), and a
    lost claim handed the same fencing token to the next claimant while the first drive
    still held it ("fencing token 1 is superseded by 0", then a decision asked twice)
    (#38). The WAL writer is slowed here, so that without the syncs the loss is certain
    rather than a matter of milliseconds."""
    url = server.create_database()
    server.query(url, "ALTER SYSTEM SET wal_writer_delay = '10s'")
    server.query(url, "SELECT pg_reload_conf()")

    @cp.workflow("queued")
    def queued(ctx: cp.Context, n: int) -> int:
        return n

    with cp.Ledger(url, key="42" * 32) as ledger:
        ledger.register(queued)
        for k in range(5):
            ledger.enqueue(queued, run_id=f"q{k}", n=k)
        store = ledger.store
        got = store.claim_next("w1", 30.0, [f"queued{chr(31)}{queued.version}"])
        lease = store.claim("q4", "w1", 30.0)
        server.crash()
    server.restart()
    with cp.Ledger(url, key="42" * 32) as ledger:
        ledger.register(queued)
        tokens = {run_id: info.token for run_id, info in ledger.leases().items()}
        assert got is not None
        assert got.run_id == "q0"
        assert tokens == {"q0": got.lease.token, "q1": 0, "q2": 0, "q3": 0, "q4": lease.token}
        Worker(ledger, poll=0.02, log=io.StringIO(), until_idle=True).serve()
        # q0 and q4 wait for w1's leases (30 s): the others are driven
        assert [ledger.get_run(f"q{k}").result for k in range(1, 4)] == [1, 2, 3]
