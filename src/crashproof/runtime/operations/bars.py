"""A run drawn over time, for the console's timeline: each step a bar from its start to
its record, its failed attempts and the waits between them marked, and each drive of the
run (a start, a resume after a crash, a retry) a line where it began, a drive that left
no outcome named as what it was: ended by a crash or a kill.

Pure: it reads a verified journal and the audit timeline of it (``audit.timeline``), and
returns positions on a 0..1 scale that a template draws as SVG; nothing is guessed (a
step whose start the journal does not hold is drawn as a tick at its record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType

__all__ = ["Bar", "Bars", "Drive", "bars"]

_OUTCOMES = {
    EventType.RUN_SUCCEEDED,
    EventType.RUN_FAILED,
    EventType.RUN_FROZEN,
    EventType.RUN_STOPPED,
    EventType.RUN_CANCELLED,
    EventType.RUN_MOVED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    key: str
    kind: str
    status: str
    start: float  # 0..1 of the run's span
    end: float
    attempts: tuple[tuple[float, float], ...] = ()  # failed attempts (start, end)
    waits: tuple[tuple[float, float], ...] = ()  # backoff waits before the next attempt
    seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Drive:
    at: float  # 0..1
    worker: str | None
    what: str  # "started", "resumed", "retried"
    ended: str  # "outcome" or "no outcome: crashed or killed" (or "in progress")


@dataclass(frozen=True, slots=True, kw_only=True)
class Bars:
    bars: tuple[Bar, ...]
    drives: tuple[Drive, ...]
    begin: float  # epoch seconds of 0
    seconds: float  # what 1 stands for


def bars(events: Sequence[Event], entries: Sequence[dict[str, Any]], keys: set[str]) -> Bars:
    """The bars of the steps ``keys`` and every drive of the run, on the scale of the
    whole run (its first record to its last), so the page's bars keep their place."""
    if not events:
        return Bars(bars=(), drives=(), begin=0.0, seconds=0.0)
    begin = events[0].created_at
    seconds = max(events[-1].created_at - begin, 1e-6)

    def x(t: float) -> float:
        return min(max((t - begin) / seconds, 0.0), 1.0)

    started: dict[str, float] = {}
    failed: dict[str, list[tuple[float, float, float]]] = {}
    found: list[Bar] = []
    for event in events:
        key = event.key
        if key is None or key not in keys:
            continue
        if event.type is EventType.ACT_INTENT:
            started.setdefault(key, float(payloads.act_intent(event).get("started_at") or 0))
        elif event.type is EventType.ATTEMPT_FAILED:
            a = payloads.attempt_failed(event)
            failed.setdefault(key, []).append(
                (float(a["started_at"]), float(a["ended_at"]), float(a["retry_in"]))
            )
        elif event.type is EventType.STEP_DONE:
            done = payloads.step_done(event)
            end = float(done.get("ended_at") or event.created_at)
            took = done.get("took_us")
            first = failed.get(key, [])
            start = (
                first[0][0]
                if first
                else started.get(key)
                or (
                    float(done["started_at"])
                    if done.get("started_at")
                    else end - (took / 1e6 if isinstance(took, int) else 0.0)
                )
            )
            found.append(
                Bar(
                    key=key,
                    kind=str(done.get("kind")),
                    status=str(done.get("status")),
                    start=x(start),
                    end=x(end),
                    attempts=tuple((x(s), x(e)) for s, e, _ in first),
                    waits=tuple((x(e), x(e + wait)) for _, e, wait in first),
                    seconds=max(end - start, 0.0),
                )
            )
    return Bars(
        bars=tuple(found), drives=tuple(_drives(events, entries, x)), begin=begin, seconds=seconds
    )


def _drives(events: Sequence[Event], entries: Sequence[dict[str, Any]], x: Any) -> list[Drive]:
    """Each drive's first record, and whether the drive reached an outcome before the
    next one began (or the journal ends)."""
    firsts = [(i, e) for i, e in enumerate(entries) if e.get("session") == e.get("seq")]
    if firsts and firsts[0][0] == 1 and firsts[0][1].get("worker") == entries[0].get("worker"):
        firsts[0] = (0, {**firsts[0][1], "at": entries[0]["at"]})  # the starter's own drive
    elif not firsts or firsts[0][0] > 0:
        firsts = [(0, entries[0]), *firsts]  # its start, by the starter
    drives: list[Drive] = []
    for n, (i, entry) in enumerate(firsts):
        stop = firsts[n + 1][0] if n + 1 < len(firsts) else len(events)
        ended = any(event.type in _OUTCOMES for event in events[i:stop])
        retried = any(
            event.type is EventType.RUN_RETRIED for event in events[max(i - 1, 0) : i + 1]
        )
        last = n + 1 == len(firsts)
        drives.append(
            Drive(
                at=x(float(entry["at"])),
                worker=entry.get("worker"),
                what="started" if n == 0 else "retried" if retried else "resumed",
                ended="outcome"
                if ended
                else "in progress or stopped without an outcome"
                if last
                else "no outcome: crashed or killed",
            )
        )
    return drives
