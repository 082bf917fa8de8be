"""An act whose last attempt ended ``cp.Unavailable`` is not in doubt on resume: the
run's stop, journaled by the runtime after ``execute`` raised, says that attempt was not
done, so the resume sends the next attempt as the drive would have, with no lookup and
no question to a person; without that record (a crash between the raise and the stop)
the act is in doubt and goes the way of any act in flight. A real tool with no lookup,
whose effect is a file, out while a real lock file exists."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.port import ActSettings

FAST = ActSettings(retryable_attempts=3, backoff=0.0)


class Publish(cp.Tool):
    """Appends a line to ``DIR/published.txt``: an effect nothing can look up. Out
    (nothing written) while ``DIR/lock`` exists."""

    name: ClassVar[str] = "publish"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def execute(self, call: cp.Call) -> cp.Receipt:
        if (self.directory / "lock").exists():
            raise cp.Unavailable("the target is locked; nothing was published")
        with (self.directory / "published.txt").open("a", encoding="utf-8") as out:
            out.write(f"{call.params['text']}\n")
        return cp.Receipt(call.operation_id, {"published": call.params["text"]})


def flow(directory: Path, shell: str = "sync", tool: cp.Tool | None = None) -> cp.Workflow[Any]:
    publish = tool or Publish(directory)
    if shell == "sync":

        @cp.workflow("publish", version="1")
        def sync(ctx: cp.Context) -> Any:
            return ctx.act("post", publish, text="hello")

        return sync

    @cp.workflow("publish", version="1")
    async def asynchronous(ctx: cp.AsyncContext) -> Any:
        return await ctx.act("post", publish, text="hello")

    return asynchronous


def ledger(directory: Path, **kw: Any) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{directory / 'l.db'}", act_settings=FAST, **kw)


def drive(led: cp.Ledger, shell: str, call: str, *args: Any, **kw: Any) -> Any:
    if shell == "sync":
        return getattr(led, call)(*args, **kw)
    return asyncio.run(getattr(led, f"{call}_async")(*args, **kw))


def twin(tmp_path: Path) -> tuple[Any, str]:
    """A run that never faulted: its result and its artifact."""
    clean = tmp_path / "twin"
    clean.mkdir()
    with ledger(clean) as led:
        result = led.run(flow(clean), run_id="r")
    return result, (clean / "published.txt").read_text()


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_an_act_out_through_its_attempts_runs_once_on_resume_without_a_lookup(
    tmp_path: Path, shell: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "lock").touch()
    led = ledger(work)
    workflow = led.register(flow(work, shell))
    with pytest.raises(cp.RunStopped, match="unavailable:post: the target is locked"):
        drive(led, shell, "run", workflow, run_id="r")
    assert not (work / "published.txt").exists()
    stop = led.journal("r")[-1]
    assert stop.type is EventType.RUN_STOPPED
    said = stop.payload["evidence"]["unavailable"]
    assert (said["attempt"], said["operation_id"]) == (3, "r/post")
    (work / "lock").unlink()  # the target is back
    got = drive(led, shell, "resume", "r")
    assert drive(led, shell, "resume", "r") == got  # replayed: nothing sent again
    info = led.get_run("r")
    tail = [(e.type.value, e.payload.get("attempt")) for e in led.journal("r") if e.key == "post"]
    led.close()
    assert info.status is cp.RunStatus.SUCCEEDED
    assert (got, (work / "published.txt").read_text()) == twin(tmp_path)  # published once
    # The attempts go on from the journal's, as in the drive; no question was asked.
    assert tail == [
        ("act_intent", 1),
        ("act_intent", 2),
        ("act_intent", 3),
        ("run_stopped", None),
        ("act_intent", 4),
        ("step_done", 4),
    ]
    assert {s.key: s.attempts for s in info.steps}["post"] == 4


def _points() -> list[str]:
    """The crash points of the run that stops: its start, each intent, the stop."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "lock").touch()
        points = cp.CrashPoints()  # never fires, only records
        with ledger(root, crash_points=points) as led, pytest.raises(cp.RunStopped):
            led.run(flow(root), run_id="r")
        return points.passed


POINTS = _points()


def test_the_points_cover_each_attempt_and_the_stop() -> None:
    assert POINTS.count("before_commit[act_intent:post]") == 3
    assert POINTS[-2:] == ["before_commit[run_stopped:post]", "after_commit[run_stopped:post]"]


@pytest.mark.parametrize("n", range(1, len(POINTS) + 1), ids=POINTS)
def test_a_crash_at_every_point_sends_only_what_the_journal_shows_not_done(
    tmp_path: Path, n: int
) -> None:
    """Before the first intent commits, the act is new work; once the stop naming the
    last attempt has committed, it is not done; in between (an intent committed, no stop
    after it: the crash may have cut the raise off, or the execute) it is in doubt, and a
    tool that cannot look it up freezes for review, as before, sending nothing."""
    point = POINTS[n - 1]
    work = tmp_path / "work"
    work.mkdir()
    (work / "lock").touch()
    crashing = ledger(work, crash_points=cp.CrashPoints(at=n))
    with crashing, pytest.raises(cp.SimulatedCrash) as crash:
        crashing.run(flow(work), run_id="r")
    assert crash.value.point == point
    (work / "lock").unlink()
    first_intent = POINTS.index("after_commit[act_intent:post]")
    in_doubt = first_intent <= n - 1 < len(POINTS) - 1
    with ledger(work) as led:
        if in_doubt:
            with pytest.raises(cp.RunFrozen, match="cannot look it up"):
                led.run(flow(work), run_id="r")
            assert led.get_run("r").status is cp.RunStatus.NEEDS_REVIEW
            assert not (work / "published.txt").exists()
            return
        got = led.run(flow(work), run_id="r")  # a new run, or its resume
        assert led.get_run("r").status is cp.RunStatus.SUCCEEDED
    assert (got, (work / "published.txt").read_text()) == twin(tmp_path)


@pytest.mark.parametrize("earlier", ["none done", "one in doubt"])
@pytest.mark.parametrize("window", [timedelta(days=1), timedelta(seconds=1)])
def test_a_target_that_may_have_forgotten_the_key_is_not_resent(
    tmp_path: Path, window: timedelta, earlier: str
) -> None:
    """A target that dedupes keys for ``idempotency_window``: inside it the attempt the
    stop says was not done is sent again. Past it (1 s, counted with the 5 s margin for
    clock skew) an earlier attempt's key may be forgotten: when an earlier attempt was in
    doubt (it timed out and was sent again under its key), the act goes the way of any
    act in flight: here, no lookup, a freeze naming the window. When the tool said of
    every attempt that it was not done, no key holds anything to forget: sent again."""

    class Remembering(Publish):
        idempotency_window: ClassVar[timedelta | None] = window
        idempotent_execute: ClassVar[bool] = True
        matches_intent: ClassVar[bool] = True
        timeouts = 1 if earlier == "one in doubt" else 0

        def execute(self, call: cp.Call) -> cp.Receipt:
            if self.timeouts:  # nothing written, but the caller cannot know
                self.timeouts -= 1
                raise TimeoutError("read timed out")
            return super().execute(call)

    publish = Remembering(tmp_path)
    (tmp_path / "lock").touch()
    with ledger(tmp_path) as led:
        with pytest.raises(cp.RunStopped):
            led.run(flow(tmp_path, tool=publish), run_id="r")
        (tmp_path / "lock").unlink()
        if window > timedelta(seconds=10) or earlier == "none done":
            assert led.resume("r") == {"published": "hello"}
            assert (tmp_path / "published.txt").read_text() == "hello\n"
            return
        with pytest.raises(cp.RunFrozen, match="may have forgotten the key"):
            led.resume("r")
    assert not (tmp_path / "published.txt").exists()


def test_an_approval_that_expired_while_the_act_was_out_is_asked_again_first(
    tmp_path: Path,
) -> None:
    """An approved act out through its attempts: by the resume its approval has expired.
    The resume asks for a fresh one before it journals the next attempt, so the act is
    still the one the stop says was not done, and with the fresh approval it is sent
    once, not frozen as in doubt for a tool that cannot look it up."""
    import time

    from crashproof.integrity.signing import generate_keypair

    risky = cp.Policy(
        "ops-1", allow={"publish": "*"}, risk={"publish": "high"}, approval_required={"high"}
    )
    options = cp.RunOptions(policy=risky)
    generate_keypair(tmp_path / "alice.pem")
    (tmp_path / "lock").touch()
    settings = ActSettings(retryable_attempts=3, backoff=0.0, max_clock_skew=0)
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", act_settings=settings) as led:
        led.register_policy(risky)
        led.add_approver("alice", (tmp_path / "alice.pem.pub").read_text(), by="root")
        workflow = led.register(flow(tmp_path))
        with pytest.raises(cp.RunFrozen):  # awaiting its approval
            led.run(workflow, run_id="r", options=options)
        led.approve("r", key=tmp_path / "alice.pem", ttl=0.5, by="alice")
        with pytest.raises(cp.RunStopped, match="locked"):
            led.resume("r")
        (tmp_path / "lock").unlink()
        time.sleep(0.6)
        with pytest.raises(cp.RunFrozen, match="expired") as frozen:
            led.resume("r")
        assert frozen.value.status == "awaiting_approval"
        intents = [e for e in led.journal("r") if e.type is EventType.ACT_INTENT]
        assert len(intents) == 3  # nothing journaled of a next attempt
        led.approve("r", key=tmp_path / "alice.pem", ttl=600, by="alice")
        assert led.resume("r") == {"published": "hello"}
    assert (tmp_path / "published.txt").read_text() == "hello\n"
