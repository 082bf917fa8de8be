"""store/combining.py: concurrent calls of one kind share one statement, one per key at
a time, and a failed shared statement leaves each call its own answer or error."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from crashproof.store.combining import Combiner


class Statements:
    """A fake ``many``: records each statement's calls, slow enough for calls to pile up."""

    def __init__(self, refuse: str | None = None) -> None:
        self.sent: list[list[tuple[str, int]]] = []
        self.refuse = refuse  # a key whose presence fails the whole statement
        self.lock = threading.Lock()

    def __call__(self, calls: list[tuple[str, int]]) -> dict[str, int]:
        with self.lock:
            self.sent.append(calls)
        time.sleep(0.01)
        if self.refuse is not None and any(key == self.refuse for key, _ in calls):
            raise ValueError(f"refused {self.refuse}")
        return {key: arg * 10 for key, arg in calls if key != "missing"}


def test_concurrent_calls_share_statements_each_gets_its_own_answer() -> None:
    many = Statements()
    combined: Combiner[str, int, int] = Combiner(many)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda k: combined(f"r{k}", k), range(64)))
    assert answers == [k * 10 for k in range(64)]
    assert len(many.sent) < 64  # shared
    assert sorted(key for sent in many.sent for key, _ in sent) == sorted(
        f"r{k}" for k in range(64)
    )


def test_one_statement_never_holds_a_key_twice() -> None:
    many = Statements()
    combined: Combiner[str, int, int] = Combiner(many)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda k: combined(f"r{k % 4}", k), range(32)))
    assert answers == [k * 10 for k in range(32)]
    for sent in many.sent:
        keys = [key for key, _ in sent]
        assert len(keys) == len(set(keys))


def test_a_key_left_out_is_answered_none() -> None:
    combined: Combiner[str, int, int] = Combiner(Statements())
    assert combined("missing", 1) is None
    assert combined("r", 2) == 20


def test_a_failed_shared_statement_leaves_each_call_its_own_error() -> None:
    many = Statements(refuse="bad")
    combined: Combiner[str, int, int] = Combiner(many)

    def call(k: int) -> int | str | None:
        try:
            return combined("bad" if k == 5 else f"r{k}", k)
        except ValueError as exc:
            return str(exc)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, range(32)))
    assert answers[5] == "refused bad"
    assert [a for k, a in enumerate(answers) if k != 5] == [k * 10 for k in range(32) if k != 5]


def test_a_call_alone_raises_its_own_error_once() -> None:
    many = Statements(refuse="bad")
    combined: Combiner[str, int, int] = Combiner(many)
    with pytest.raises(ValueError, match="refused bad"):
        combined("bad", 1)
    assert len(many.sent) == 1


def test_a_crash_in_the_leading_call_is_raised_not_swallowed() -> None:
    class Crash(BaseException):
        pass

    first_sent = threading.Event()
    go_on = threading.Event()

    def many(calls: list[tuple[str, int]]) -> dict[str, int]:
        if len(calls) > 1:
            raise Crash
        if not first_sent.is_set():  # the first statement stays in flight meanwhile
            first_sent.set()
            go_on.wait(10)
        return {key: arg for key, arg in calls}

    combined: Combiner[str, int, int] = Combiner(many)
    outcomes: list[object] = []

    def call(k: int) -> None:
        try:
            outcomes.append(combined(f"r{k}", k))
        except Crash:
            outcomes.append("crash")

    threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
    threads[0].start()
    first_sent.wait(10)
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 10
    while len(combined._pending) < 7 and time.monotonic() < deadline:
        time.sleep(0.001)  # the seven others wait for the first statement
    go_on.set()
    for thread in threads:
        thread.join(timeout=10)
    # The next statement (the seven) crashed: its leader raised the crash, the six
    # others were answered alone.
    assert outcomes.count("crash") == 1
    assert len(outcomes) == 8  # the seven others got their own answers
