"""Control characters in recorded text, written as escapes wherever people read it.

A run id, a reason or a recorded value holding ``ESC[2J`` (clear the screen), an OSC 52
clipboard write or a bidirectional override reorders or rewrites what a terminal or a
page shows. The CLI (``crashproof.cli.render``) and the console (``crashproof.console``)
both show them as ``\\x1b[2J``, ``\\u202e``: one rule, kept here.
"""

from __future__ import annotations

import re

__all__ = ["CONTROLS", "safe"]

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI), and the
# bidirectional embeddings, overrides and isolates that reorder what a terminal shows.
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """``text`` with every control character written as an escape, as ``repr`` does."""
    return CONTROLS.sub(_escaped, text)
