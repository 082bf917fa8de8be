"""Runs stopped for a retryable cause are resumed by a worker on its own, with backoff and
a stored next-attempt time; runs that wait for a person never are (DESIGN.md section 15).

A service that is out raises ``cp.Unavailable`` (a model API's 5xx, a refused connection);
a lookup that keeps failing stops the run the same way. Every worker reads the schedule
from the run index, so ``crashproof runs`` and ``show`` can say when the next attempt is."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.runtime.port import ActSettings
from crashproof.runtime.worker import Worker

LedgerFactory = Callable[..., cp.Ledger]
WAIT = 60.0  # generous on a loaded machine; never reached when green


class Service:
    """Out (``cp.Unavailable``) while ``down``; counts its calls."""

    def __init__(self) -> None:
        self.down = True
        self.calls = 0
        self.served = 0

    def __call__(self, what: str) -> str:
        self.calls += 1
        if self.down:
            raise cp.Unavailable("503 Service Unavailable")
        self.served += 1
        return f"answer to {what}"


def outage_workflow(service: Service) -> cp.Workflow[Any]:
    @cp.workflow("outage")
    def outage(ctx: cp.Context, what: str) -> str:
        ctx.step("before", lambda: "done before")
        return str(ctx.step("ask", service, what))

    return outage


def events(log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, db_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return "memory://" if request.param == "memory" else f"sqlite:///{db_path}"


@pytest.fixture
def serving() -> Iterator[Callable[[Worker], threading.Thread]]:
    """Start a worker's ``serve`` in a thread; stopped and joined at teardown."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(worker: Worker) -> threading.Thread:
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        started.append((worker, thread))
        return thread

    yield start
    for worker, thread in started:
        worker.stop()
        thread.join(WAIT)


def wait_until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_run_stopped_by_an_outage_is_resumed_by_a_worker_with_backoff(
    open_ledger: LedgerFactory,
    store_url: str,
    serving: Callable[[Worker], threading.Thread],
) -> None:
    service = Service()
    wf = outage_workflow(service)
    ledger = open_ledger(store_url)
    with pytest.raises(cp.RunStopped, match="unavailable:ask"):
        ledger.run(wf, run_id="o", what="q")
    assert ledger.get_run("o").status is cp.RunStatus.STOPPED
    assert ledger.leases()["o"].retry_at is None  # due as soon as a worker polls

    log = io.StringIO()
    worker = Worker(ledger, poll=0.02, log=log, retry_first=0.2, retry_max=0.8)
    serving(worker)
    wait_until("four automatic attempts", lambda: service.calls >= 5)
    lease = ledger.leases()["o"]
    assert lease.retries >= 3
    assert lease.retry_at is not None
    service.down = False
    wait_until("the run to succeed", lambda: ledger.get_run("o").status.terminal)
    assert ledger.get_run("o").status is cp.RunStatus.SUCCEEDED
    assert service.served == 1
    # The worker logs its end after the run's status is committed: wait for the line.
    wait_until(
        "the worker to log the end",
        lambda: any(e["event"] == "succeeded" for e in events(log) if e.get("run_id") == "o"),
    )

    seen = [e for e in events(log) if e.get("run_id") == "o"]
    claims = [e for e in seen if e["event"] == "claimed"]
    stops = [e for e in seen if e["event"] == "stopped"]
    assert [e["retry"] for e in claims][:4] == [1, 2, 3, 4]  # each claim one more attempt
    assert all(e["retryable"] for e in stops)
    # The stored wait doubles from retry_first up to retry_max, by the store's clock.
    waits = [e["next_attempt_at"] - time_of(e) for e in stops[:4]]
    for wait, expected in zip(waits, [0.4, 0.8, 0.8, 0.8], strict=True):
        assert expected - 0.15 < wait < expected + 0.15, waits
    # No attempt before its time: each claim comes after the wait its stop announced.
    for stop, claim in zip(stops, claims[1:], strict=False):
        assert time_of(claim) >= stop["next_attempt_at"] - 0.05
    assert seen[-1]["event"] == "succeeded"


def time_of(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["ts"]).timestamp()


class Busy(cp.Tool):
    """Its execute always finds the target in a state it did not expect, or held."""

    name: ClassVar[str] = "busy"

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.executes = 0

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.executes += 1
        raise self.error("someone else changed it")

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        return None


def test_a_worker_never_resumes_a_run_that_waits_for_a_person(open_ledger: LedgerFactory) -> None:
    """Drift and a busy resource freeze for review; a budget stops; none is claimed, by
    any number of workers, however long they serve."""
    drift, busy = Busy(cp.DriftError), Busy(cp.ResourceBusy)

    @cp.workflow("waits")
    def waits(ctx: cp.Context, kind: str) -> str:
        if kind == "budget":
            ctx.step("one", lambda: 1)
            ctx.step("two", lambda: 2)
        else:
            ctx.act("change", drift if kind == "drift" else busy, x=kind)
        return kind

    ledger = open_ledger(act_settings=ActSettings(retryable_attempts=1, backoff=0.0))
    with pytest.raises(cp.RunFrozen):
        ledger.run(waits, run_id="drift", kind="drift")
    with pytest.raises(cp.RunFrozen):
        ledger.run(waits, run_id="busy", kind="busy")
    budget = cp.RunOptions(limits=cp.Limits(max_steps=1))
    with pytest.raises(cp.RunStopped, match="budget"):
        ledger.run(waits, run_id="budget", kind="budget", options=budget)
    before = {r.run_id: (r.status, r.reason) for r in ledger.runs()}
    assert {run: status for run, (status, _) in before.items()} == {
        "drift": cp.RunStatus.NEEDS_REVIEW,
        "busy": cp.RunStatus.NEEDS_REVIEW,
        "budget": cp.RunStatus.STOPPED,
    }
    log = io.StringIO()
    worker = Worker(ledger, poll=0.02, until_idle=True, log=log, retry_first=0.01)
    assert worker.serve() == 0
    assert [e["event"] for e in events(log)] == ["worker_started", "worker_stopped"]
    assert {r.run_id: (r.status, r.reason) for r in ledger.runs()} == before
    assert (drift.executes, busy.executes) == (1, 1)


def test_runs_and_show_say_when_a_worker_tries_a_stopped_run_again(
    open_ledger: LedgerFactory, db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = Service()
    ledger = open_ledger()
    with pytest.raises(cp.RunStopped):
        ledger.run(outage_workflow(service), run_id="o", what="q")
    url = f"sqlite:///{db_path}"
    capsys.readouterr()
    assert main(["runs", "--db", url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["retryable"], row["next_attempt_at"], row["retries"]) == (True, None, 0)

    claimed = ledger.store.claim_next("w", 5.0, ["outage\x1f1"])  # type: ignore[attr-defined]
    assert claimed.retry == 1
    ledger.store.release("o", claimed.lease)
    at = ledger.store.schedule_retry("o", 600.0, 1)  # type: ignore[attr-defined]
    assert at is not None
    assert at > time.time() + 500
    assert ledger.store.claim_next("w", 5.0, ["outage\x1f1"]) is None  # type: ignore[attr-defined]
    assert main(["runs", "--db", url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["next_attempt_at"], row["retries"]) == (pytest.approx(at), 1)
    assert main(["runs", "--db", url]) == 0
    assert "next attempt" in capsys.readouterr().out
    assert main(["show", "o", "--db", url]) == 0
    shown = capsys.readouterr().out
    assert "retryable stop: a worker (crashproof worker) resumes it at" in shown
    assert main(["show", "o", "--db", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["next_attempt_at"] == pytest.approx(at)


def test_a_worker_on_a_loop_resumes_a_stopped_run_too(
    open_ledger: LedgerFactory, serving: Callable[[Worker], threading.Thread]
) -> None:
    service = Service()
    ledger = open_ledger("memory://")
    with pytest.raises(cp.RunStopped):
        ledger.run(outage_workflow(service), run_id="o", what="q")
    log = io.StringIO()
    worker = Worker(ledger, poll=0.02, log=log, on_loop=True, retry_first=0.1, retry_max=0.2)
    serving(worker)
    wait_until("an automatic attempt", lambda: service.calls >= 2)
    service.down = False
    wait_until("the run to succeed", lambda: ledger.get_run("o").status.terminal)
    assert ledger.get_run("o").status is cp.RunStatus.SUCCEEDED
    stops = [e for e in events(log) if e["event"] == "stopped"]
    assert stops
    assert all(e["retryable"] and e["next_attempt_at"] for e in stops)
