"""How recorded values reach a page: every ``{{ … }}`` goes through ``finalize`` (control
characters written as escapes, as ``crashproof show`` writes them) and then Jinja's
autoescape (``<script>`` is text); times, JSON and budgets are formatted here."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from crashproof.journal.controls import safe
from crashproof.journal.fold import tokens_of

__all__ = ["environment"]


def _finalize(value: Any) -> Any:
    """Applied to every expression a template prints, before autoescape."""
    if value is None:
        return ""
    if isinstance(value, Markup):  # the templates' own markup, never recorded data
        return value
    return safe(value if isinstance(value, str) else str(value))


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        when = dt.datetime.fromtimestamp(ts).astimezone()
    except (ValueError, OverflowError, OSError, TypeError):  # a file edited past any calendar
        return f"{ts!r} (not a date)"
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _pretty(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


PREVIEW = 4000  # characters of a value shown in a run's page; its step's page shows all


def _preview(text: Any, whole: bool = False) -> str:
    """``text`` cut to ``PREVIEW`` characters unless ``whole``, saying how much is left."""
    shown = "" if text is None else str(text)
    if whole or len(shown) <= PREVIEW:
        return shown
    return f"{shown[:PREVIEW]}\n… {len(shown) - PREVIEW:,} more characters (open the step: whole)"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _cost(cost: float | None) -> str:
    return "-" if not cost else f"{cost:.4f}"


def _query(args: dict[str, Any], **changes: Any) -> str:
    """``?a=b&…`` of ``args`` with ``changes``; empty values left out."""
    merged = {**args, **changes}
    return "?" + urlencode({k: v for k, v in merged.items() if v not in (None, "")})


def _shell(word: Any) -> str:
    """``word`` quoted for a POSIX shell, as a command to copy must be."""
    text = safe(str(word))
    if text and all(c.isalnum() or c in "@%+=:,./-_#" for c in text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=_when,
        pretty=_pretty,
        preview=_preview,
        ms=_ms,
        cost=_cost,
        tokens=tokens_of,
        shell=_shell,
    )
    env.globals["query"] = _query
    return env
