"""Concurrent calls of one kind, one statement: the threads that start runs side by side
(a hundred async drives on one loop hop to the commit threads at once) each ask the
database the same kind of question about their own run; one statement answers them all.

A thread that finds no statement of its kind in flight sends every call asked so far (one
per key) in one statement and hands each caller its answer; the calls that arrive
meanwhile wait for it, then the next of them sends theirs. When that statement fails,
each of its callers asks again alone, so an error (a value the database refuses, a
deadlock) is always its own call's. Used by the PostgreSQL store and witness
(``bench/concurrency.py --postgres``: one round trip for some 30 runs' claims instead of
one each).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

__all__ = ["Combiner"]

K = TypeVar("K", bound=Hashable)
A = TypeVar("A")
R = TypeVar("R")


class _Call(Generic[K, A, R]):
    __slots__ = ("alone", "arg", "done", "key", "value")

    def __init__(self, key: K, arg: A) -> None:
        self.key = key
        self.arg = arg
        self.value: R | None = None
        self.done = False
        self.alone = False  # the shared statement failed: ask again alone


class Combiner(Generic[K, A, R]):
    """``many(calls)``: the answers to several calls (key, argument), their keys distinct
    (a run id: one statement never touches a run twice), in one statement, as
    {key: answer}; a key it leaves out is answered None. Thread-safe."""

    def __init__(self, many: Callable[[list[tuple[K, A]]], Mapping[K, R]]) -> None:
        self._many = many
        self._cond = threading.Condition()
        self._pending: list[_Call[K, A, R]] = []
        self._busy = False  # a statement of this kind is in flight

    def __call__(self, key: K, arg: A) -> R | None:
        call: _Call[K, A, R] = _Call(key, arg)
        with self._cond:
            self._pending.append(call)
        while True:
            with self._cond:
                while self._busy and not call.done:
                    self._cond.wait()
                if call.done:
                    break
                batch = self._take()  # this call's, unless a call of its key came first
            self._send(batch, call)
        if call.alone:  # the shared statement failed: this call's own answer, or error
            return self._many([(key, arg)]).get(key)
        return call.value

    def _send(self, batch: list[_Call[K, A, R]], mine: _Call[K, A, R]) -> None:
        """Answer ``batch`` with one statement (this thread leads it)."""
        try:
            found = self._many([(c.key, c.arg) for c in batch])
        except BaseException as exc:
            with self._cond:
                for other in batch:
                    other.done = other.alone = True
                self._busy = False
                self._cond.notify_all()
            if batch == [mine] or not isinstance(exc, Exception):
                raise  # this call alone: its own error; or a crash, never swallowed
            return
        with self._cond:
            for other in batch:
                other.value = found.get(other.key)
                other.done = True
            self._busy = False
            self._cond.notify_all()

    def _take(self) -> list[_Call[K, A, R]]:
        """The pending calls with distinct keys (under the condition's lock); a second
        call of a key stays for the next statement."""
        self._busy = True
        batch: list[_Call[K, A, R]] = []
        rest: list[_Call[K, A, R]] = []
        keys: set[K] = set()
        for pending in self._pending:
            if pending.key in keys:
                rest.append(pending)
            else:
                keys.add(pending.key)
                batch.append(pending)
        self._pending = rest
        return batch
