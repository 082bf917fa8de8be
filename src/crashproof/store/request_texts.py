"""A decision's request text as a store keeps it: the text itself, or, where a database
could not hold it as it is, a JSON string of it, every character past ASCII escaped.

A request text the runtime builds is canonical JSON (``runtime/steps/arguments.py``):
its control characters are escaped and it has no lone surrogate, so it is kept as it
is. But ``Store.append`` takes any text, and two kinds no database keeps: a NUL
(PostgreSQL's ``text`` refuses it; SQLite's ``length()`` and ``substr()``, which cut a
text into its parts, stop at it, so the text came back cut short) and a lone surrogate
(no UTF-8 at all). Such a text is kept as its JSON string (``"..."``, ASCII: ``\\u0000``,
``\\udcff``), which ``json.loads`` gives back exactly; so is a text that begins with a
quote, which a request never does, so that a kept text beginning with one is always
such a string. The digest a record holds (``request_sha256``) is of the text, never of
the form it is kept in: ``crashproof check`` and the request viewers read the text back
first. The memory store keeps Python strings: it needs none of this.
"""

from __future__ import annotations

import json

from crashproof.journal.codec import ascii_json

__all__ = ["kept_form", "kept_text"]


def kept_form(text: str) -> str:
    """``text`` as a database keeps it (see the module docstring)."""
    if "\x00" in text or text[:1] == '"' or not (text.isascii() or _utf8(text)):
        return ascii_json(text)
    return text


def kept_text(stored: str) -> str:
    """The text ``kept_form`` kept as ``stored``."""
    if stored[:1] != '"':
        return stored
    text = json.loads(stored)
    if not isinstance(text, str):  # pragma: no cover - only kept_form writes a quote first
        raise ValueError("a kept request in quotes that is not one JSON string")
    return text


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
