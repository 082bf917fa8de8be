"""A long verification's progress for a person watching: how many cases are done and
about how long is left.

On a terminal it is one line rewritten in place (and wiped when the phase ends, so the
report that follows starts clean); anywhere else (a pipe, a CI log) it is a plain line
every tenth of the way and at the end, so a log shows progress without a wall of
carriage returns. The time left is the mean time per case so far times the cases left:
an estimate, said as one ("about").
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

__all__ = ["ProgressLine"]


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class ProgressLine:
    """``progress(done, total, label)`` for ``crashproof.verify.verify`` (its ``Progress``):
    ``what`` names the cases ("crash points killed and resumed"). Call ``close()`` when the
    phase ends; a terminal's line is wiped then, a plain log gets its last line if the
    final count had not been printed."""

    STEPS = 10  # plain lines per phase

    def __init__(
        self, console: Console, what: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.console = console
        self.what = what
        self.clock = clock
        self.started = clock()
        self.tty = console.is_terminal
        self.printed = -1  # the count at the last plain line (-1: none yet)
        self.last: tuple[int, int] = (0, 0)

    def line(self, done: int, total: int) -> str:
        elapsed = self.clock() - self.started
        text = f"{done}/{total} {self.what}"
        if 0 < done < total:
            text += f", about {_duration(elapsed / done * (total - done))} left"
        elif done >= total > 0:
            text += f", in {_duration(elapsed)}"
        return text

    def __call__(self, done: int, total: int, label: str) -> None:
        self.last = (done, total)
        if self.tty:
            text = f"{self.line(done, total)}: {label}"
            width = max(20, self.console.width - 1)
            # \r and erase-to-end: the line is replaced, never scrolled
            self.console.file.write("\r" + text[:width] + "\x1b[K")
            self.console.file.flush()
            return
        # a line each time the count crosses a tenth of the total (which may grow)
        if total and done * self.STEPS // total > max(self.printed, 0) * self.STEPS // total:
            self.printed = done
            self.console.print("  " + escape(self.line(done, total)), highlight=False)

    def close(self) -> None:
        if self.tty:
            self.console.file.write("\r\x1b[K")
            self.console.file.flush()
            return
        done, total = self.last
        if total and self.printed != done:
            self.console.print("  " + escape(self.line(done, total)), highlight=False)
