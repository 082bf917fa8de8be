"""A foreign message (a tool's, a service's, git's stderr) as a reason shows it: on one
line, bounded, its start and its end kept.

A message often says what failed first and why last, after a long path: git's
``Unable to create '<path>/index.lock': File exists``, git's "<path>/objects/pack: Not a
directory", a ``TimeoutExpired`` whose argv comes before "timed out after N seconds".
Cut to its start, the why is gone; whole, a huge message floods a terminal and a log
line. ``shown`` keeps a message of up to ``limit`` characters whole (563 for a reason)
and a longer one's start and end around " … ", the end getting the larger share (200
and 360 characters of a reason). Whoever shows a message this way keeps the whole of it
where a person can read it (a stop's or a freeze's evidence, a failure's error record).

A tool bounds the detail it puts at the end of its own message to ``DETAIL``: both of
the detail's ends then fit in the end a reason keeps of that message, whatever its
start said (an OSError's errno text comes before its path, git's after it).

A leaf, imported by the tools, the journal and the runtime alike (tests/unit/
test_layers.py).
"""

from __future__ import annotations

__all__ = ["DETAIL", "LIMIT", "shown"]

_MARK = " … "
LIMIT = 563  # a reason's: 200 characters of the start, " … ", 360 of the end
DETAIL = 300  # a tool's detail, at the end of its message: within a reason's 360


def shown(message: str, limit: int = LIMIT) -> str:
    """``message`` on one line (its whitespace collapsed): at most ``limit`` characters,
    a longer one cut in the middle, 5/14 of the rest kept from its start and 9/14 from
    its end (below 5, a character of each end all the same)."""
    flat = " ".join(message.split())
    if len(flat) <= limit:
        return flat
    room = max(limit - len(_MARK), 2)
    head = room * 5 // 14 or 1
    return flat[:head].rstrip() + _MARK + flat[-(room - head) :].lstrip()
