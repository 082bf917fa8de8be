"""The outbox against a real HTTP receiver on loopback: messages journaled in the step's
own commit, delivered after it with the operation id as dedupe key, never lost, never
sent for a step that did not commit."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp


class Receiver:
    """A chat-like webhook: no lookup, no idempotency of its own; it records every POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.down = False
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if receiver.down:
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver.posts.append((self.headers["Dedupe-Key"], body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def send(self, message: cp.Message) -> str:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(message.body).encode(),
            headers={"Content-Type": "application/json", "Dedupe-Key": message.dedupe_key},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return f"http-{response.status}"

    def keys(self) -> Counter[str]:
        return Counter(key for key, _ in self.posts)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def make(outbox: cp.Outbox) -> cp.Workflow[str]:
    @cp.workflow("notify", version="1")
    def notify(ctx: cp.Context, build: int) -> str:
        status = ctx.step("build", lambda: "green")
        ctx.act("notify", outbox, text=f"build {build} is {status}")
        return status

    return notify


def ledger(tmp_path: Path, points: cp.CrashPoints | None = None) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points)


def test_delivered_once_and_replay_sends_nothing(tmp_path: Path, receiver: Receiver) -> None:
    outbox = cp.Outbox("chat", receiver.send)
    assert ledger(tmp_path).run(make(outbox), run_id="b1", build=1) == "green"
    assert receiver.posts == [("b1/notify", {"text": "build 1 is green"})]
    assert ledger(tmp_path).run(make(outbox), run_id="b1", build=1) == "green"
    assert len(receiver.posts) == 1
    step = ledger(tmp_path).get_run("b1").steps[-1]
    assert (step.operation_id, step.delivery) == ("b1/notify", "delivered")


@pytest.mark.parametrize(
    ("point", "posts"),
    [
        ("before_commit[step_done:notify]", 1),  # not committed: nothing may leave
        ("after_commit[step_done:notify]", 1),  # committed, not delivered: delivered on resume
        ("before_commit[outbox_delivered:notify]", 2),  # delivered, record lost: again, same key
        ("after_commit[outbox_delivered:notify]", 1),
    ],
)
def test_crash_windows(tmp_path: Path, receiver: Receiver, point: str, posts: int) -> None:
    outbox = cp.Outbox("chat", receiver.send)
    with pytest.raises(cp.SimulatedCrash):
        ledger(tmp_path, cp.CrashPoints(match=point)).run(make(outbox), run_id="b1", build=1)
    if point.startswith("before_commit[step_done"):
        assert receiver.posts == []  # a message never leaves before its step commits
    assert ledger(tmp_path).run(make(outbox), run_id="b1", build=1) == "green"
    assert len(receiver.posts) == posts
    assert set(receiver.keys()) == {"b1/notify"}  # one dedupe key, however many tries
    assert ledger(tmp_path).get_run("b1").steps[-1].delivery == "delivered"


def test_target_down_keeps_the_message_pending_then_dispatch(
    tmp_path: Path, receiver: Receiver
) -> None:
    outbox = cp.Outbox("chat", receiver.send)
    receiver.down = True
    assert ledger(tmp_path).run(make(outbox), run_id="b2", build=2) == "green"  # run goes on
    info = ledger(tmp_path).get_run("b2")
    assert info.status is cp.RunStatus.SUCCEEDED
    assert info.steps[-1].delivery == "pending"
    assert receiver.posts == []
    with pytest.raises(urllib.error.HTTPError):
        outbox.execute(
            cp.Call(run_id="x", step="s", operation_id="x/s", intent_digest="d", params={})
        )
    receiver.down = False
    assert ledger(tmp_path).dispatch_outbox([outbox]) == 1
    assert receiver.posts == [("b2/notify", {"text": "build 2 is green"})]
    assert ledger(tmp_path).dispatch_outbox([outbox]) == 0  # nothing left
    assert ledger(tmp_path).get_run("b2").steps[-1].delivery == "delivered"


def test_dispatch_skips_a_run_another_worker_holds(tmp_path: Path, receiver: Receiver) -> None:
    from crashproof.store.sqlite import SQLiteStore

    outbox = cp.Outbox("chat", receiver.send)
    receiver.down = True
    assert ledger(tmp_path).run(make(outbox), run_id="b3", build=3) == "green"
    receiver.down = False
    store = SQLiteStore(tmp_path / "l.db")
    try:
        held = store.claim("b3", "elsewhere:1:abcd", 600.0)
        assert ledger(tmp_path).dispatch_outbox([outbox]) == 0  # its holder may be delivering
        assert receiver.posts == []
        store.release("b3", held)
    finally:
        store.close()
    assert ledger(tmp_path).dispatch_outbox([outbox]) == 1
    assert receiver.keys() == Counter({"b3/notify": 1})
    leases = ledger(tmp_path).leases()
    assert (leases["b3"].owner, leases["b3"].token) == (None, held.token + 1)  # released


def async_sender(receiver: Receiver) -> Any:
    """The same webhook through httpx's async client: an async ``deliver``."""
    import httpx

    async def send(message: cp.Message) -> str:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.post(
                receiver.url, json=message.body, headers={"Dedupe-Key": message.dedupe_key}
            )
            response.raise_for_status()
            return f"http-{response.status_code}"

    return send


def make_async(outbox: cp.Outbox) -> cp.Workflow[str]:
    @cp.workflow("notify-async", version="1")
    async def notify(ctx: cp.Context, build: int) -> str:
        status = await ctx.step("build", lambda: "green")
        await ctx.act("notify", outbox, text=f"build {build} is {status}")
        return str(status)

    return notify


@pytest.mark.parametrize(
    ("point", "posts"),
    [
        ("after_commit[step_done:notify]", 1),  # committed, not delivered: delivered on resume
        ("before_commit[outbox_delivered:notify]", 2),  # delivered, record lost: same key
    ],
)
def test_an_async_deliver_is_awaited_on_the_runs_loop(
    tmp_path: Path, receiver: Receiver, point: str, posts: int
) -> None:
    outbox = cp.Outbox("chat", async_sender(receiver))
    assert isinstance(outbox, cp.Outbox)
    points = cp.CrashPoints(match=point)
    with pytest.raises(cp.SimulatedCrash):
        asyncio.run(ledger(tmp_path, points).run_async(make_async(outbox), run_id="a", build=1))
    assert asyncio.run(ledger(tmp_path).run_async(make_async(outbox), run_id="a", build=1)) == (
        "green"
    )
    assert len(receiver.posts) == posts
    assert set(receiver.keys()) == {"a/notify"}
    assert ledger(tmp_path).get_run("a").steps[-1].delivery == "delivered"


def test_an_async_deliver_is_refused_by_a_sync_drive_and_dispatched_later(
    tmp_path: Path, receiver: Receiver
) -> None:
    outbox = cp.Outbox("chat", async_sender(receiver))
    with pytest.raises(cp.AsyncMisuse, match="async execute"):
        ledger(tmp_path).run(make(outbox), run_id="s", build=1)
    assert ledger(tmp_path).get_run("s").steps[-1].kind != "act"  # nothing of the act

    # A pending message of an ended run is delivered by the sync dispatcher, on a loop of
    # its own; called on a running loop it refuses and delivers nothing.
    receiver.down = True
    asyncio.run(ledger(tmp_path).run_async(make_async(outbox), run_id="p", build=2))
    assert ledger(tmp_path).get_run("p").steps[-1].delivery == "pending"
    receiver.down = False

    async def on_the_loop() -> None:
        with pytest.raises(cp.AsyncMisuse, match=r"asyncio\.to_thread"):
            ledger(tmp_path).dispatch_outbox([outbox])
        assert await asyncio.to_thread(ledger(tmp_path).dispatch_outbox, [outbox]) == 1

    asyncio.run(on_the_loop())
    assert receiver.posts == [("p/notify", {"text": "build 2 is green"})]
    assert ledger(tmp_path).get_run("p").steps[-1].delivery == "delivered"
