"""The worker's periodic outbox pass: nothing pending in silence.

A message whose target was down when its run ended stays pending in the journal; a
worker given outbox tools (``Worker(outbox=...)``, CLI: ``worker --app`` with a
``cp.Outbox`` in the module) delivers them on its own, at most every ``every`` seconds
(bounded: one ``dispatch_outbox`` pass over the runs no process drives, under each run's
lease, so it never races a resume or another worker's pass).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from crashproof.errors import CrashproofError
from crashproof.tools.port import Tool

__all__ = ["OutboxPass"]

log = logging.getLogger(__name__)


class _Dispatcher(Protocol):
    def dispatch_outbox(self, tools: Sequence[Tool]) -> int: ...


class OutboxPass:
    """Calls ``dispatch_outbox`` when due; free (one clock read) when not, or without tools."""

    def __init__(self, ledger: _Dispatcher, tools: Sequence[Tool], every: float) -> None:
        if not every > 0:
            raise ValueError(f"the outbox pass interval must be > 0 seconds, not {every!r}")
        self._ledger = ledger
        self.tools = tuple(tools)
        self.every = float(every)
        self._due = 0.0  # the first pass runs at once

    def tick(self) -> int:
        """Deliver what is pending if a pass is due; the number delivered."""
        if not self.tools or time.monotonic() < self._due:
            return 0
        self._due = time.monotonic() + self.every
        try:
            return self._ledger.dispatch_outbox(self.tools)
        except CrashproofError as exc:  # the next pass tries again; the worker keeps going
            log.warning("outbox pass failed: %s", exc)
            return 0
