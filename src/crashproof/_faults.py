"""Named crash points: where the runtime can be made to die on purpose.

The runtime calls ``hit(point)`` on each side of every journal commit. A ledger
without crash points holds None and pays one attribute test per commit. The
verifier and the tests arm them: record every point a run passes, then crash at
the n-th one (or at a named one) by raising ``SimulatedCrash`` (in-process) or by
SIGKILL of the whole process (realistic).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Literal

from crashproof.errors import SimulatedCrash

__all__ = ["CrashPoints"]

Action = Literal["raise", "sigkill"]


class CrashPoints:
    """Records the crash points a run passes and fires at the chosen one.

    ``at``: fire at the n-th point passed (1-based), or ``match``: at the first
    point whose name equals it. ``action``: "raise" a SimulatedCrash (nothing more is
    written by the runtime while it unwinds) or "sigkill" this process.
    """

    def __init__(
        self,
        *,
        at: int | None = None,
        match: str | None = None,
        action: Action | Callable[[str], None] = "raise",
    ) -> None:
        self.at = at
        self.match = match
        self.action = action
        self.passed: list[str] = []
        self.fired: str | None = None

    def hit(self, point: str) -> None:
        self.passed.append(point)
        if self.fired is not None:
            return
        if len(self.passed) == self.at or point == self.match:
            self.fired = point
            self.fire(point)

    def fire(self, point: str) -> None:
        if self.action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if callable(self.action):
            self.action(point)
            return
        raise SimulatedCrash(point)
