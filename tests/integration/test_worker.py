"""ledger.enqueue, resume(wait=) and the Worker in this process: queued runs are driven
once each, a draining worker stops runs at a step boundary and releases them, runs that
end are never claimed again. The multi-process scenarios are in test_worker_processes."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import crashproof as cp
from crashproof.runtime.worker import Worker
from crashproof.store.queue import LeaseInfo

LedgerFactory = Callable[..., cp.Ledger]
WAIT = 10.0


class Counter:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, what: str) -> str:
        with self._lock:
            self.calls.append(what)
        return what


def counted_workflow(counter: Counter, pause: float = 0.0) -> cp.Workflow[Any]:
    @cp.workflow("counted")
    def counted(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.step("s", lambda i=i: (time.sleep(pause), counter(f"{ctx.run_id}:{i}"))[1])
        return n

    return counted


def events(log: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


def test_enqueue_records_the_run_without_driving_it(open_ledger: LedgerFactory) -> None:
    counter = Counter()
    wf = counted_workflow(counter)
    ledger = open_ledger()
    ledger.enqueue(wf, run_id="q", n=2)
    ledger.enqueue(wf, run_id="q", n=2)  # same input: nothing more
    with pytest.raises(cp.RunConflict):
        ledger.enqueue(wf, run_id="q", n=3)
    info = ledger.get_run("q")
    assert (info.status, info.steps, counter.calls) == (cp.RunStatus.RUNNING, (), [])
    assert ledger.leases()["q"].owner is None
    assert ledger.run(wf, run_id="q", n=2) == 2  # run() picks an enqueued run up
    ledger.enqueue(wf, run_id="q", n=2)  # an ended run stays ended
    assert ledger.get_run("q").status is cp.RunStatus.SUCCEEDED
    assert counter.calls == ["q:0", "q:1"]


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_a_worker_drives_every_queued_run_once(open_ledger: LedgerFactory, url: str) -> None:
    counter = Counter()
    wf = counted_workflow(counter, pause=0.01)
    ledger = open_ledger(None if url == "sqlite" else url)
    for i in range(10):
        ledger.enqueue(wf, run_id=f"r{i}", n=3)
    log = io.StringIO()
    worker = Worker(ledger, concurrency=4, poll=0.05, until_idle=True, log=log)
    assert worker.serve() == 0
    assert sorted(counter.calls) == sorted(f"r{i}:{j}" for i in range(10) for j in range(3))
    assert all(info.status is cp.RunStatus.SUCCEEDED for info in ledger.runs())
    assert worker.completed == 10
    names = [e["event"] for e in events(log)]
    assert (names[0], names[-1]) == ("worker_started", "worker_stopped")
    assert names.count("claimed") == names.count("succeeded") == 10
    assert all(e["worker"] == ledger.worker_id for e in events(log))
    assert {e["run_id"] for e in events(log) if e["event"] == "claimed"} == {
        f"r{i}" for i in range(10)
    }


def test_a_draining_worker_finishes_the_current_step_and_releases_the_run(
    open_ledger: LedgerFactory,
) -> None:
    entered, opened = threading.Event(), threading.Event()
    done: list[str] = []

    def slow(name: str) -> str:
        if name == "first" and not done:
            entered.set()
            opened.wait(WAIT)
        done.append(name)
        return name

    @cp.workflow("two-steps")
    def two_steps(ctx: cp.Context) -> list[str]:
        return [ctx.step("first", slow, "first"), ctx.step("second", slow, "second")]

    ledger = open_ledger()
    ledger.enqueue(two_steps, run_id="d")
    log = io.StringIO()
    worker = Worker(ledger, concurrency=2, poll=0.05, log=log)
    served: list[int] = []
    thread = threading.Thread(target=lambda: served.append(worker.serve()))
    thread.start()
    assert entered.wait(WAIT)
    worker.stop()
    opened.set()
    thread.join(WAIT)
    assert served == [0]
    # The step in progress finished and was recorded; the next one never started.
    assert done == ["first"]
    info = ledger.get_run("d")
    assert info.status is cp.RunStatus.RUNNING
    assert [(s.key, s.status.value) for s in info.steps] == [("first", "succeeded")]
    assert ledger.leases()["d"].owner is None  # released: claimable at once
    assert [e["event"] for e in events(log) if e.get("run_id") == "d"] == ["claimed", "released"]

    other = open_ledger()
    other.register(two_steps)
    assert Worker(other, poll=0.05, until_idle=True, log=io.StringIO()).serve() == 0
    assert other.get_run("d").result == ["first", "second"]
    assert done == ["first", "second"]  # nothing ran twice


def test_runs_that_end_badly_are_reported_and_not_claimed_again(
    open_ledger: LedgerFactory,
) -> None:
    @cp.workflow("bad")
    def bad(ctx: cp.Context) -> None:
        ctx.step("boom", lambda: (_ for _ in ()).throw(ValueError("boom")))

    ledger = open_ledger()
    ledger.enqueue(bad, run_id="b")
    log = io.StringIO()
    assert Worker(ledger, poll=0.05, until_idle=True, log=log).serve() == 0
    failed = [e for e in events(log) if e["event"] == "failed"]
    assert [(e["run_id"], e["error"]) for e in failed] == [("b", "boom")]
    assert ledger.get_run("b").status is cp.RunStatus.FAILED
    log = io.StringIO()
    assert Worker(ledger, poll=0.05, until_idle=True, log=log).serve() == 0
    assert [e["event"] for e in events(log)] == ["worker_started", "worker_stopped"]


def test_resume_waits_for_a_held_run_when_asked(open_ledger: LedgerFactory) -> None:
    entered, opened = threading.Event(), threading.Event()

    def gate() -> str:
        entered.set()
        opened.wait(WAIT)
        return "through"

    @cp.workflow("gated")
    def gated(ctx: cp.Context) -> str:
        return str(ctx.step("gate", gate))

    first, second = open_ledger(), open_ledger()
    second.register(gated)
    driver = threading.Thread(target=lambda: first.run(gated, run_id="g"))
    driver.start()
    assert entered.wait(WAIT)

    began = time.monotonic()
    with pytest.raises(cp.LeaseHeld, match=f"owned by worker {first.worker_id} until "):
        second.resume("g", wait=0.3)  # held all along: gives up after the wait
    assert time.monotonic() - began >= 0.3

    threading.Timer(0.3, opened.set).start()
    assert second.resume("g", wait=WAIT) == "through"  # proceeds once released
    driver.join(WAIT)


def test_a_worker_needs_workflows_and_sane_settings(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()
    with pytest.raises(ValueError, match="concurrency"):
        Worker(ledger, concurrency=0)
    with pytest.raises(ValueError, match="poll"):
        Worker(ledger, poll=0)
    with pytest.raises(ValueError, match="registers no workflows"):
        Worker(ledger, log=io.StringIO()).serve()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, db_path: Any) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{db_path}"


def test_each_worker_pickup_claims_the_run_once(open_ledger: LedgerFactory, store_url: str) -> None:
    """The queue's claim is the drive's lease: the fencing token grows by exactly one per
    worker that picks a run up (resume does not claim it a second time)."""
    entered, opened = threading.Event(), threading.Event()

    def gate() -> None:
        entered.set()
        opened.wait(WAIT)

    @cp.workflow("tokens")
    def tokens(ctx: cp.Context, gated: bool) -> list[Any]:
        # Each step records the fencing token its run was driven under at the time.
        first = ctx.step("first", lambda: (gate() if gated else None, ctx.fencing_token)[1])
        return [first, ctx.step("second", lambda: ctx.fencing_token)]

    ledger = open_ledger(store_url)
    for i in range(3):
        ledger.enqueue(tokens, run_id=f"p{i}", gated=False)
    log = io.StringIO()
    assert Worker(ledger, concurrency=2, poll=0.05, until_idle=True, log=log).serve() == 0
    claims = [e for e in events(log) if e["event"] == "claimed"]
    assert sorted((e["run_id"], e["token"]) for e in claims) == [("p0", 1), ("p1", 1), ("p2", 1)]
    for i in range(3):
        assert ledger.get_run(f"p{i}").result == [1, 1]
        assert ledger.leases()[f"p{i}"] == LeaseInfo(None, None, 1)  # one claim, released

    # Picked up twice (a worker drains mid-run, another finishes it): two claims.
    ledger.enqueue(tokens, run_id="d", gated=True)
    draining = Worker(ledger, poll=0.05, log=io.StringIO())
    thread = threading.Thread(target=draining.serve)
    thread.start()
    assert entered.wait(WAIT)
    draining.stop()
    opened.set()
    thread.join(WAIT)
    assert ledger.leases()["d"].token == 1
    other = open_ledger(store_url)
    other.register(tokens)
    log = io.StringIO()
    assert Worker(other, poll=0.05, until_idle=True, log=log).serve() == 0
    assert [e["token"] for e in events(log) if e["event"] == "claimed"] == [2]
    assert other.get_run("d").result == [1, 2]
    assert other.leases()["d"].token == 2


def async_counted(counter: Counter, pause: float = 0.0) -> cp.Workflow[Any]:
    @cp.workflow("acounted")
    async def acounted(ctx: cp.AsyncContext, n: int) -> int:
        async def one(i: int) -> str:
            await asyncio.sleep(pause)
            return counter(f"{ctx.run_id}:{i}")

        for i in range(n):
            await ctx.step("s", one, i)
        return n

    return acounted


@pytest.mark.parametrize("on_loop", [True, False])
def test_a_worker_drives_async_and_sync_runs_either_way(
    open_ledger: LedgerFactory, on_loop: bool
) -> None:
    """On one event loop (async workflows awaited, sync ones in a thread) or a thread per
    run (an async one on a loop of that thread's own): every queued run once."""
    counter = Counter()
    awf, swf = async_counted(counter, pause=0.01), counted_workflow(counter, pause=0.01)
    ledger = open_ledger()
    for i in range(20):
        ledger.enqueue(awf, run_id=f"a{i}", n=3)
    for i in range(3):
        ledger.enqueue(swf, run_id=f"s{i}", n=2)
    log = io.StringIO()
    worker = Worker(ledger, concurrency=8, poll=0.05, until_idle=True, log=log, on_loop=on_loop)
    assert worker.serve() == 0
    wanted = [f"a{i}:{j}" for i in range(20) for j in range(3)]
    assert sorted(counter.calls) == sorted(
        wanted + [f"s{i}:{j}" for i in range(3) for j in range(2)]
    )
    assert all(info.status is cp.RunStatus.SUCCEEDED for info in ledger.runs())
    assert worker.completed == 23
    names = [e["event"] for e in events(log)]
    assert names.count("claimed") == names.count("succeeded") == 23
    assert events(log)[0]["on_loop"] is on_loop


def test_a_draining_worker_on_a_loop_stops_async_runs_at_a_step(open_ledger: LedgerFactory) -> None:
    entered = threading.Event()
    done: list[str] = []

    async def slow(name: str) -> str:
        if name == "first" and not done:
            entered.set()
            await asyncio.sleep(0.3)
        done.append(name)
        return name

    @cp.workflow("atwo")
    async def atwo(ctx: cp.AsyncContext) -> list[str]:
        return [await ctx.step("first", slow, "first"), await ctx.step("second", slow, "second")]

    ledger = open_ledger()
    ledger.enqueue(atwo, run_id="d")
    log = io.StringIO()
    worker = Worker(ledger, concurrency=4, poll=0.05, log=log, on_loop=True)
    served: list[int] = []
    thread = threading.Thread(target=lambda: served.append(worker.serve()))
    thread.start()
    assert entered.wait(WAIT)
    worker.stop()
    thread.join(WAIT)
    assert served == [0]
    assert done == ["first"]
    assert ledger.get_run("d").status is cp.RunStatus.RUNNING
    assert ledger.leases()["d"].owner is None  # released: claimable at once
    assert [e["event"] for e in events(log) if e.get("run_id") == "d"] == ["claimed", "released"]
