"""An act stopped ``cp.Unavailable`` and the hold on its intent (steps/holds.py): two
runs on one ledger act on one target. When the tool said of every attempt of run A's
act that it was not done, and the run's stop says so, nothing of A's act can have
happened: the stop releases its hold, and run B acting on the same target goes on (before,
B froze for review until A resumed, a question for a person about an effect the journal
proves never ran). A's resume holds the intent again before it sends: while B holds it
unresolved (B's act in doubt), A waits, stopped retryable, never racing B's effect; once
B is resolved, A goes on. Where the journal does not prove A's act not done (the crash
cut the stop off; an earlier attempt was in doubt), A keeps the hold and B waits, as
before. A real target (a file) with a lookup by operation id, out while a lock exists."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.runtime.port import ActSettings

FAST = ActSettings(retryable_attempts=3, lookup_attempts=1, backoff=0.0)


class Post(cp.Tool):
    """Appends ``OPERATION_ID TEXT`` to ``DIR/posted.txt``; out (nothing written) while
    ``DIR/lock`` exists; ``lookup`` reads the file. ``timeouts``: the first executes
    that time out with nothing written."""

    name: ClassVar[str] = "post"
    version: ClassVar[str] = "1"
    matches_intent: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = True

    def __init__(self, directory: Path, timeouts: int = 0) -> None:
        self.directory = directory
        self.timeouts = timeouts

    def lines(self) -> list[str]:
        path = self.directory / "posted.txt"
        return path.read_text().splitlines() if path.exists() else []

    def execute(self, call: cp.Call) -> cp.Receipt:
        if self.timeouts:
            self.timeouts -= 1
            raise TimeoutError("read timed out")
        if (self.directory / "lock").exists():
            raise cp.Unavailable("the target is locked; nothing was posted")
        with (self.directory / "posted.txt").open("a", encoding="utf-8") as out:
            out.write(f"{call.operation_id} {call.params['text']}\n")
        return cp.Receipt(call.operation_id, {"posted": call.params["text"]})

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if f"{call.operation_id} {call.params['text']}" in self.lines():
            return cp.Receipt(call.operation_id, {"posted": call.params["text"]})
        return None


def flow(tool: cp.Tool, shell: str = "sync") -> cp.Workflow[Any]:
    if shell == "sync":

        @cp.workflow("post", version="1")
        def sync(ctx: cp.Context) -> Any:
            return ctx.act("post", tool, text="hello")

        return sync

    @cp.workflow("post", version="1")
    async def asynchronous(ctx: cp.AsyncContext) -> Any:
        return await ctx.act("post", tool, text="hello")

    return asynchronous


def ledger(url: str, tool: cp.Tool, shell: str = "sync", **kw: Any) -> cp.Ledger:
    led = cp.Ledger(url, act_settings=FAST, **kw)
    led.register(flow(tool, shell))
    return led


def drive(led: cp.Ledger, shell: str, call: str, *args: Any, **kw: Any) -> Any:
    if shell == "sync":
        return getattr(led, call)(*args, **kw)
    return asyncio.run(getattr(led, f"{call}_async")(*args, **kw))


def stop_a(url: str, tool: Post, shell: str) -> None:
    """Run A: the target is locked through every attempt; A stops, resumable."""
    (tool.directory / "lock").touch()
    with ledger(url, tool, shell) as led, pytest.raises(cp.RunStopped, match="locked"):
        drive(led, shell, "run", flow(tool, shell), run_id="A")
    (tool.directory / "lock").unlink()  # the target is back


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_act_stopped_not_done_holds_nothing_and_resumes_after_another_run(
    tmp_path: Path, shell: str
) -> None:
    url, tool = f"sqlite:///{tmp_path / 'l.db'}", Post(tmp_path)
    stop_a(url, tool, shell)
    with ledger(url, tool, shell) as led:
        assert led.store.unresolved_intents() == []  # the stop released A's hold
        assert drive(led, shell, "run", flow(tool, shell), run_id="B") == {"posted": "hello"}
        assert drive(led, shell, "resume", "A") == {"posted": "hello"}  # A's own, once
        statuses = {r: led.get_run(r).status for r in "AB"}
        assert led.store.unresolved_intents() == []
    assert statuses == {"A": cp.RunStatus.SUCCEEDED, "B": cp.RunStatus.SUCCEEDED}
    assert tool.lines() == ["B/post hello", "A/post hello"]


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_the_resume_waits_while_the_other_run_holds_the_intent_in_doubt(
    tmp_path: Path, shell: str
) -> None:
    """B posted, then died before its receipt: its act is in doubt. A's resume must not
    post under its own key meanwhile (B's may be the effect both were after): stopped
    retryable, naming B, nothing sent; the wait is no record of A's act, so the next
    resume still knows no attempt was done. B's resume looks its act up; then A goes on."""
    url, tool = f"sqlite:///{tmp_path / 'l.db'}", Post(tmp_path)
    stop_a(url, tool, shell)
    points = cp.CrashPoints(match="before_commit[step_done:post]")
    with ledger(url, tool, shell, crash_points=points) as led, pytest.raises(cp.SimulatedCrash):
        drive(led, shell, "run", flow(tool, shell), run_id="B")
    with ledger(url, tool, shell) as led:
        with pytest.raises(cp.RunStopped, match="waiting for another run: run 'B' holds"):
            drive(led, shell, "resume", "A")
        assert tool.lines() == ["B/post hello"]  # A sent nothing
        with pytest.raises(cp.RunStopped, match="run 'B' holds"):  # still held: A waits again
            drive(led, shell, "resume", "A")
        assert led.get_run("A").status is cp.RunStatus.STOPPED
        assert drive(led, shell, "resume", "B") == {"posted": "hello"}  # looked up: found
        assert drive(led, shell, "resume", "A") == {"posted": "hello"}
        assert led.get_run("A").status is cp.RunStatus.SUCCEEDED
        attempts = {s.key: s.attempts for s in led.get_run("A").steps}
    assert tool.lines() == ["B/post hello", "A/post hello"]
    assert attempts == {"post": 4}  # 1-3 out, 4 sent once it was A's turn


def test_an_operator_can_let_the_resume_pass_the_run_it_waits_for(tmp_path: Path) -> None:
    url, tool = f"sqlite:///{tmp_path / 'l.db'}", Post(tmp_path)
    stop_a(url, tool, "sync")
    points = cp.CrashPoints(match="before_commit[step_done:post]")
    with ledger(url, tool, crash_points=points) as led, pytest.raises(cp.SimulatedCrash):
        led.run(flow(tool), run_id="B")
    with ledger(url, tool) as led:
        with pytest.raises(cp.RunStopped, match="--override-intent B"):
            led.resume("A")
        assert led.resume("A", override_intent=["B"], by="alice") == {"posted": "hello"}
    assert tool.lines() == ["B/post hello", "A/post hello"]


def test_a_stop_the_crash_cut_off_keeps_the_hold(tmp_path: Path) -> None:
    """Killed between the last attempt's raise and the stop: the journal cannot tell
    the attempt was not done, so A holds its intent and B waits, as before."""
    url, tool = f"sqlite:///{tmp_path / 'l.db'}", Post(tmp_path)
    (tmp_path / "lock").touch()
    points = cp.CrashPoints(match="before_commit[run_stopped:post]")
    with ledger(url, tool, crash_points=points) as led, pytest.raises(cp.SimulatedCrash):
        led.run(flow(tool), run_id="A")
    (tmp_path / "lock").unlink()
    with ledger(url, tool) as led:
        with pytest.raises(cp.RunStopped, match="run 'A' holds the same intent"):
            led.run(flow(tool), run_id="B")
        assert led.resume("A") == {"posted": "hello"}  # looked up: not found, sent
        assert led.resume("B") == {"posted": "hello"}
    assert tool.lines() == ["A/post hello", "B/post hello"]


def test_a_stop_after_an_attempt_in_doubt_keeps_the_hold(tmp_path: Path) -> None:
    """A's first attempt timed out (it may have posted), the next ones were out: the stop
    proves the last attempt not done, not the act, so A holds its intent and B waits."""
    url, tool = f"sqlite:///{tmp_path / 'l.db'}", Post(tmp_path, timeouts=1)
    stop_a(url, tool, "sync")
    with ledger(url, tool) as led:
        assert [h.run_id for h in led.store.unresolved_intents()] == ["A"]
        with pytest.raises(cp.RunStopped, match="run 'A' holds the same intent"):
            led.run(flow(tool), run_id="B")
        assert led.resume("A") == {"posted": "hello"}
        assert led.resume("B") == {"posted": "hello"}
    assert tool.lines() == ["A/post hello", "B/post hello"]


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_on_postgresql_the_stop_releases_the_hold(pg_url: str, tmp_path: Path, shell: str) -> None:
    """The checked append (sync) and the async batch's statement release it alike."""
    tool = Post(tmp_path)
    stop_a(pg_url, tool, shell)
    with ledger(pg_url, tool, shell) as led:
        assert led.store.unresolved_intents() == []
        assert drive(led, shell, "run", flow(tool, shell), run_id="B") == {"posted": "hello"}
        assert drive(led, shell, "resume", "A") == {"posted": "hello"}
    assert tool.lines() == ["B/post hello", "A/post hello"]
