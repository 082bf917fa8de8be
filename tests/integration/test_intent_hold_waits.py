"""A run whose new act another run's unresolved act holds (``cp.IntentHeld``) waits
without a person (DESIGN.md section 15; runtime/steps/holds.py): nothing of its act is
sent or journaled, so nothing is in doubt but the wait, and it stops retryable
(``unavailable:<key>: waiting for another run: ...``). A real worker resumes it with
its usual backoff: once the holder is resolved (here by the same worker, which takes the
crashed holder over and looks its act up), the waiter sends, once. While the holder is
frozen for a person, the waiter keeps waiting, capped, sending nothing, and goes on once
the holder is resolved; an operator's override passes the holder from the stop. Before,
the waiter froze ``needs_review`` and no worker ever claimed it: the first two tests
time out so on the old code."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.port import ActSettings
from crashproof.runtime.worker import Worker

WAIT = 30.0  # generous on a loaded machine; never reached when green
FAST = ActSettings(retryable_attempts=2, lookup_attempts=1, backoff=0.0)
RUNS = ("holder", "waiter")


class Orders(cp.Tool):
    """Records ``operation_id -> intent digest`` in ``DIR/orders.json``; while
    ``DIR/lock`` exists the target is held by someone else (``cp.ResourceBusy``: nothing
    written); ``lookup`` reads the file."""

    name: ClassVar[str] = "orders"
    version: ClassVar[str] = "1"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def state(self) -> dict[str, str]:
        path = self.directory / "orders.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def execute(self, call: cp.Call) -> cp.Receipt:
        if (self.directory / "lock").exists():
            raise cp.ResourceBusy("the orders table is locked by another program")
        state = self.state()
        state.setdefault(call.operation_id, call.intent_digest)
        (self.directory / "orders.json").write_text(json.dumps(state))
        return cp.Receipt(call.operation_id, {"n": len(state)}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        digest = self.state().get(call.operation_id)
        return None if digest is None else cp.Receipt(call.operation_id, {"n": 1}, digest)


def flow(tool: cp.Tool, shell: str) -> cp.Workflow[Any]:
    if shell == "sync":

        @cp.workflow("orders", version="1")
        def sync(ctx: cp.Context, customer: str) -> Any:
            ctx.step("prepare", lambda: customer)
            return ctx.act("create", tool, customer=customer)

        return sync

    @cp.workflow("orders", version="1")
    async def asynchronous(ctx: cp.AsyncContext, customer: str) -> Any:
        await ctx.step("prepare", lambda: customer)
        return await ctx.act("create", tool, customer=customer)

    return asynchronous


def drive(led: cp.Ledger, shell: str, call: str, *args: Any, **kw: Any) -> Any:
    if shell == "sync":
        return getattr(led, call)(*args, **kw)
    return asyncio.run(getattr(led, f"{call}_async")(*args, **kw))


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, db_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{db_path}"


@pytest.fixture
def serving() -> Iterator[Callable[[Worker], None]]:
    """Start a worker's ``serve`` in a thread; stopped and joined at teardown."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(worker: Worker) -> None:
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        started.append((worker, thread))

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


def events(log: io.StringIO, run_id: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    return [e for e in lines if e.get("run_id") == run_id]


def worker(led: cp.Ledger, shell: str, log: io.StringIO) -> Worker:
    on_loop = shell == "async"
    return Worker(led, poll=0.02, log=log, on_loop=on_loop, retry_first=0.05, retry_max=0.2)


def wait_on(led: cp.Ledger, tool: Orders, shell: str) -> None:
    """Run ``waiter``: its act's intent is held by ``holder``; it stops, sending nothing."""
    with pytest.raises(cp.RunStopped, match="waiting for another run: run 'holder' holds"):
        drive(led, shell, "run", flow(tool, shell), run_id="waiter", customer="c1")
    assert "waiter/create" not in tool.state()
    assert led.get_run("waiter").status is cp.RunStatus.STOPPED


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_worker_resumes_the_waiting_run_once_the_holder_is_resolved(
    open_ledger: Callable[..., cp.Ledger],
    url: str,
    tmp_path: Path,
    shell: str,
    serving: Callable[[Worker], None],
) -> None:
    """The holder's process died between its effect and its receipt (in flight); the
    worker takes it over once its lease runs out, looks its act up (found: not sent
    again), and then the waiter, retried with backoff meanwhile, sends its own."""
    tool = Orders(tmp_path)
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    crashing = open_ledger(url, crash_points=points, lease_seconds=0.5)
    with pytest.raises(cp.SimulatedCrash):
        drive(crashing, shell, "run", flow(tool, shell), run_id="holder", customer="c1")
    assert list(tool.state()) == ["holder/create"]  # its effect happened
    led = open_ledger(url, act_settings=FAST)
    led.register(flow(tool, shell))
    wait_on(led, tool, shell)

    log = io.StringIO()
    serving(worker(led, shell, log))
    done = {cp.RunStatus.SUCCEEDED}
    wait_until("both to succeed", lambda: {led.get_run(r).status for r in RUNS} == done)
    assert sorted(tool.state()) == ["holder/create", "waiter/create"]  # each once
    assert led.store.unresolved_intents() == []
    journal = led.journal("waiter")
    assert not [e for e in journal if e.type is EventType.RUN_FROZEN]
    [intent] = [e for e in journal if e.type is EventType.ACT_INTENT]  # sent once, at the end
    stops = [e for e in journal if e.type is EventType.RUN_STOPPED]
    assert stops
    assert all(s.seq < intent.seq for s in stops)
    wait_until(
        "the worker to log the waiter's end",
        lambda: any(e["event"] == "succeeded" for e in events(log, "waiter")),
    )
    seen = events(log, "waiter")
    assert all(e["retryable"] for e in seen if e["event"] == "stopped")
    assert not [e for e in seen if e["event"] == "frozen"]


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_the_waiter_keeps_waiting_while_the_holder_is_frozen_then_goes_on(
    open_ledger: Callable[..., cp.Ledger],
    url: str,
    tmp_path: Path,
    shell: str,
    serving: Callable[[Worker], None],
) -> None:
    """The holder froze for a person (the target busy through its attempts: its act's
    intent journaled, unresolved). The worker resumes the waiter again and again, the
    wait capped at retry_max, never sending; it never claims the frozen holder. Once a
    person resumes the holder (the lock gone: its act sent, its hold released), the
    worker's next attempt sends the waiter's act."""
    tool = Orders(tmp_path)
    led = open_ledger(url, act_settings=FAST)
    led.register(flow(tool, shell))
    (tmp_path / "lock").touch()
    with pytest.raises(cp.RunFrozen, match="locked"):
        drive(led, shell, "run", flow(tool, shell), run_id="holder", customer="c1")
    (tmp_path / "lock").unlink()
    assert led.get_run("holder").status is cp.RunStatus.NEEDS_REVIEW
    wait_on(led, tool, shell)

    log = io.StringIO()
    serving(worker(led, shell, log))
    wait_until("five automatic attempts", lambda: led.leases()["waiter"].retries >= 5)
    assert tool.state() == {}  # nothing sent: the waiter waits, the holder is frozen
    assert led.get_run("holder").status is cp.RunStatus.NEEDS_REVIEW
    assert led.get_run("waiter").status in (cp.RunStatus.STOPPED, cp.RunStatus.RUNNING)
    stops = [e for e in events(log, "waiter") if e["event"] == "stopped"]
    waits = [e["next_attempt_at"] - datetime.fromisoformat(e["ts"]).timestamp() for e in stops]
    assert all(wait < 0.2 + 0.15 for wait in waits), waits  # capped at retry_max
    assert not events(log, "holder")  # a run frozen for a person is never claimed

    assert drive(led, shell, "resume", "holder") == {"n": 1}  # the person's one command
    wait_until("the waiter to succeed", lambda: led.get_run("waiter").status.terminal)
    assert led.get_run("waiter").status is cp.RunStatus.SUCCEEDED
    assert sorted(tool.state()) == ["holder/create", "waiter/create"]
    assert led.store.unresolved_intents() == []


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_operator_overrides_the_holder_from_the_stop(tmp_path: Path, shell: str) -> None:
    """The holder stays frozen; the operator lets the waiter pass it, from the stop the
    waiter is in (journaled who and whom), and it sends once; nothing else passes."""
    tool = Orders(tmp_path)
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", act_settings=FAST) as led:
        led.register(flow(tool, shell))
        (tmp_path / "lock").touch()
        with pytest.raises(cp.RunFrozen):
            drive(led, shell, "run", flow(tool, shell), run_id="holder", customer="c1")
        (tmp_path / "lock").unlink()
        wait_on(led, tool, shell)
        with pytest.raises(cp.CrashproofError, match="not by stranger"):
            drive(led, shell, "resume", "waiter", override_intent=["stranger"], by="alice")
        passed = drive(led, shell, "resume", "waiter", override_intent=["holder"], by="alice")
        assert passed == {"n": 1}
        [override] = [e for e in led.journal("waiter") if e.type is EventType.INTENT_OVERRIDE]
        assert (override.key, override.payload["holders"]) == ("create", ["holder"])
        assert override.payload["by"] == "alice"
        assert led.get_run("holder").status is cp.RunStatus.NEEDS_REVIEW
    assert list(tool.state()) == ["waiter/create"]
