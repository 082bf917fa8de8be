"""The ids that hold a run's trace together across processes: derived, not drawn.

A SIGKILLed process cannot end the spans it has open, so whatever they parent would
point at a span never sent. Each id a later process must name is therefore a function
of what every process of the run knows (the ledger, the run id, a drive's fencing
token, a call's key, attempt and journal position):

- the trace: one per run, ``H(namespace, run id)``;
- the run's span (the root): sent once, when ``run_started`` commits, so it exists
  before any child does (Temporal's interceptor does the same with ``StartWorkflow``);
- a drive's span (``drive <workflow>``), by its fencing token: sent when the drive ends
  in its process, or, when that process died, by the next drive, which finds the dead
  drive's token in its lease receipt and its records in the journal;
- a live call's span, by (key, attempt, seq): a call the kill interrupted and the same
  call run again on resume share it, so what the interrupted call's HTTP client sent
  nests under the span the resume sends.

Why not a parentless design with links: a trace viewer shows links as footnotes, and the
drives of one run would be separate roots; derived ids keep one tree.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace.id_generator import IdGenerator

__all__ = ["Chosen", "call_id", "drive_id", "run_id", "trace_id"]


def _h(*parts: object, size: int) -> int:
    text = "\0".join(str(p) for p in parts).encode()
    value = int.from_bytes(hashlib.sha256(text).digest()[:size], "big")
    return value or 1  # 0 is the invalid id


def trace_id(namespace: str, run: str) -> int:
    return _h("crashproof trace", namespace, run, size=16)


def run_id(namespace: str, run: str) -> int:
    return _h("crashproof run", namespace, run, size=8)


def drive_id(namespace: str, run: str, token: int | None) -> int:
    return _h("crashproof drive", namespace, run, token, size=8)


def call_id(namespace: str, run: str, key: str, attempt: int, seq: int) -> int:
    return _h("crashproof call", namespace, run, key, attempt, seq, size=8)


class Chosen(IdGenerator):
    """The SDK tracer's id generator, answering a chosen id inside ``choose`` (on this
    thread) and the wrapped generator's otherwise."""

    def __init__(self, inner: IdGenerator) -> None:
        self._inner = inner
        self._next = threading.local()

    @contextmanager
    def choose(self, trace: int, span: int) -> Iterator[None]:
        self._next.ids = (trace, span)
        try:
            yield
        finally:
            self._next.ids = None

    def generate_span_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return self._inner.generate_span_id() if ids is None else int(ids[1])

    def generate_trace_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return self._inner.generate_trace_id() if ids is None else int(ids[0])

    def is_trace_id_random(self) -> bool:
        return False  # derived from the run id: W3C's random flag must not be set
