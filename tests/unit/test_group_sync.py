"""The group committer behind forced syncs: waiters that arrive while a sync is in flight
share the next one; a failed sync is never taken for a durable one."""

from __future__ import annotations

import threading
import time

import pytest

from crashproof.store.syncing import GroupSync


def test_waiters_that_arrive_during_a_sync_share_the_next_one() -> None:
    committed = [1]
    flushed: list[int] = []
    in_flight, release = threading.Event(), threading.Event()

    def flush() -> int:
        covered = committed[0]
        flushed.append(covered)
        if len(flushed) == 1:
            in_flight.set()
            release.wait(10)
        return covered

    group = GroupSync(flush)
    leader = threading.Thread(target=group.wait, args=(1,))
    leader.start()
    assert in_flight.wait(10)
    committed[0] = 6  # five more commits while the first sync is in flight
    followers = [threading.Thread(target=group.wait, args=(k,)) for k in range(2, 7)]
    for thread in followers:
        thread.start()
    time.sleep(0.1)
    release.set()
    for thread in [leader, *followers]:
        thread.join(10)
        assert not thread.is_alive()
    assert flushed == [1, 6]  # the five later commits shared one sync
    assert group.flushes == 2
    group.wait(6)  # already durable: returns without a sync
    assert group.flushes == 2


def test_a_failed_sync_raises_and_the_next_waiter_syncs_again() -> None:
    attempts: list[int] = []

    def flush() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("EIO")
        return 3

    group = GroupSync(flush)
    with pytest.raises(OSError, match="EIO"):
        group.wait(3)
    assert group.flushes == 0  # nothing was made durable
    group.wait(3)
    assert (len(attempts), group.flushes) == (2, 1)


def test_covered_waiters_return_while_the_next_leader_syncs_the_rest() -> None:
    """The leader wakes the waiters its flush covered at once, and one waiter it did not
    cover to lead the next flush; the rest return only after that flush."""
    committed = [3]  # the first flush starts with 3 commits
    flushed: list[int] = []
    first_in_flight, release_first = threading.Event(), threading.Event()
    second_in_flight, release_second = threading.Event(), threading.Event()

    def flush() -> int:
        covered = committed[0]
        flushed.append(covered)
        if len(flushed) == 1:
            first_in_flight.set()
            release_first.wait(10)
        else:
            second_in_flight.set()
            release_second.wait(10)
        return covered

    group = GroupSync(flush)
    returned: list[int] = []

    def wait(ticket: int) -> None:
        group.wait(ticket)
        returned.append(ticket)

    leader = threading.Thread(target=wait, args=(1,))
    leader.start()
    assert first_in_flight.wait(10)
    committed[0] = 6  # three more commits after the first flush read its count
    waiters = [threading.Thread(target=wait, args=(t,)) for t in (2, 3, 5, 6)]
    for thread in waiters:
        thread.start()
    time.sleep(0.1)  # all parked behind the flush in flight
    release_first.set()
    assert second_in_flight.wait(10)  # one of 5 and 6 leads it
    deadline = time.monotonic() + 10
    while len(returned) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(returned) == [1, 2, 3]  # covered: returned during the second flush
    release_second.set()
    for thread in [leader, *waiters]:
        thread.join(10)
        assert not thread.is_alive()
    assert sorted(returned) == [1, 2, 3, 5, 6]
    assert flushed == [3, 6]
    assert group.flushes == 2


class Interrupted(Exception):
    pass


class Halt(BaseException):
    """Like KeyboardInterrupt or a simulated crash: not an Exception."""


def test_a_waiter_interrupted_while_parked_strands_nobody() -> None:
    """A parked waiter that is interrupted (a signal in the main thread) leaves the queue:
    the waiter parked after it, not it, leads the next sync (else nobody would)."""
    import signal

    committed = [1]
    release = threading.Event()

    def flush() -> int:
        covered = committed[0]
        if covered == 1:
            release.wait(10)
        return covered

    group = GroupSync(flush)
    # Daemons: a broken hand-over strands them, and the test must fail, not hang.
    leader = threading.Thread(target=group.wait, args=(1,), daemon=True)
    leader.start()
    time.sleep(0.05)
    committed[0] = 5
    other = threading.Thread(target=group.wait, args=(5,), daemon=True)
    later = threading.Timer(0.05, other.start)  # parks after the main thread
    later.start()

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted):
            group.wait(5)  # parks first, behind the flush in flight; then interrupted
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    later.join(10)
    release.set()
    for thread in (leader, other):
        thread.join(10)
        assert not thread.is_alive()
    assert group.flushes == 2  # the other waiter led a sync of its own
    group.wait(5)  # durable now: returns at once
    assert group.flushes == 2


def test_the_leader_reports_what_its_flush_covered_before_waking_anyone() -> None:
    """``after`` gets the notes of the leader and of the waiters its flush covered (not
    of one that committed after the flush began), before any of them returns."""
    committed = [2]
    in_flight, release = threading.Event(), threading.Event()
    reports: list[dict[str, int]] = []
    returned: list[str] = []

    def flush() -> int:
        covered = committed[0]
        if not in_flight.is_set():
            in_flight.set()
            release.wait(10)
        return covered

    returned_before: list[list[str]] = []

    def after(notes: dict[str, int]) -> None:
        reports.append(dict(notes))
        returned_before.append(list(returned))

    group = GroupSync(flush)
    group.after = after

    def wait(run: str, ticket: int, generation: int) -> None:
        group.wait(ticket, {run: generation})
        returned.append(run)

    leader = threading.Thread(target=wait, args=("a", 1, 5))
    leader.start()
    assert in_flight.wait(10)
    covered = threading.Thread(target=wait, args=("b", 2, 7))  # committed before the flush
    late = threading.Thread(target=wait, args=("c", 3, 9))  # committed after it began
    covered.start()
    time.sleep(0.05)
    committed[0] = 3
    late.start()
    time.sleep(0.1)
    release.set()
    for thread in (leader, covered, late):
        thread.join(10)
        assert not thread.is_alive()
    assert reports == [{"a": 5, "b": 7}, {"c": 9}]
    assert returned_before[0] == []  # told before the waiters it covered went on
    assert "c" not in returned_before[1]
    assert group.flushes == 2


def test_a_failing_after_hook_fails_no_waiter() -> None:
    """The hook is best effort: each waiter advances what it needs again itself."""
    group = GroupSync(lambda: 1)

    def after(notes: dict[str, int]) -> None:
        raise OSError("witness unavailable")

    group.after = after
    group.wait(1, {"a": 3})
    assert group.flushes == 1


def test_an_interrupted_after_hook_still_hands_over() -> None:
    """A signal-like exception raised in the hook reaches the leader, and the waiters its
    flush covered are still released (the flush itself succeeded)."""
    committed = [1]
    in_flight, release = threading.Event(), threading.Event()

    def flush() -> int:
        covered = committed[0]
        if not in_flight.is_set():
            in_flight.set()
            release.wait(10)
        return covered

    calls: list[dict[str, int]] = []

    def after(notes: dict[str, int]) -> None:
        calls.append(notes)
        if len(calls) == 1:
            raise Halt  # not an Exception: the hook's own guard lets it through

    group = GroupSync(flush)
    group.after = after
    outcome: list[str] = []

    def lead() -> None:
        try:
            group.wait(1, {"a": 1})
        except Halt:
            outcome.append("leader interrupted")

    leader = threading.Thread(target=lead, daemon=True)
    leader.start()
    assert in_flight.wait(10)
    follower = threading.Thread(target=group.wait, args=(1, {"b": 2}), daemon=True)
    follower.start()
    time.sleep(0.05)
    release.set()
    for thread in (leader, follower):
        thread.join(10)
        assert not thread.is_alive()  # the follower was released, not stranded
    assert outcome == ["leader interrupted"]
    assert group.flushes == 1
