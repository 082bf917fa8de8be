"""``crashproof show RUN --timeline``: every journal record with who wrote it and with
which versions (see ``crashproof.runtime.operations.audit``), and the environments a frozen run
found changed, recorded and observed side by side."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from crashproof.cli.render import safe

__all__ = ["environments_table", "print_timeline"]

_DASH = Text("-", style="dim")


def _text(value: Any, style: str = "") -> Text:
    return _DASH if value in (None, "") else Text(safe(str(value)), style=style)


def _when(ts: float) -> str:
    try:
        when = dt.datetime.fromtimestamp(ts).astimezone()
    except (ValueError, OverflowError, OSError):  # a file edited past any calendar
        return f"{ts!r} (not a date)"
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def timeline_table(run_id: str, entries: Sequence[dict[str, Any]]) -> Table:
    table = Table(title=f"timeline of {run_id}", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("seq", "time", "record", "key", "what", "by", "crashproof", "wf", "policy"):
        table.add_column(column, overflow="fold")
    session = object()
    for entry in entries:
        operator = entry.get("operator")
        by = f"{operator['by']}@{operator['host']} (operator)" if operator else entry.get("worker")
        if entry.get("session") != session:  # a new driving session starts here
            session = entry.get("session")
            if entry is not entries[0]:
                table.add_section()
        table.add_row(
            Text(str(entry["seq"])),
            Text(_when(entry["at"])),
            Text(safe(str(entry["type"]))),
            _text(entry.get("key")),
            _text(entry.get("summary")),
            _text(by),
            _text(entry.get("crashproof")),
            _text(entry.get("workflow_version")),
            _text(entry.get("policy_version")),
        )
    return table


def environments_table(evidence: dict[str, Any] | None) -> Table | None:
    """The environments of an EnvironmentChanged freeze: recorded vs observed."""
    changes = (evidence or {}).get("environments")
    if not isinstance(changes, list) or not changes:
        return None
    table = Table(title="environments changed", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("tool", "step", "change", "recorded", "observed"):
        table.add_column(column, overflow="fold")
    for change in changes:
        recorded = change.get("recorded") or {}
        observed = change.get("observed") or {}
        table.add_row(
            _text(change.get("tool")),
            _text(change.get("step")),
            _text(change.get("change"), "bold yellow"),
            Text(safe(f"{recorded.get('instance')}\n{recorded.get('fingerprint')}")),
            Text(safe(f"{observed.get('instance')}\n{observed.get('fingerprint')}")),
        )
    return table


def print_timeline(
    out: Console, run_id: str, entries: Sequence[dict[str, Any]], evidence: Any
) -> None:
    parts: list[RenderableType] = [timeline_table(run_id, entries)]
    envs = environments_table(evidence if isinstance(evidence, dict) else None)
    if envs is not None:
        parts.append(envs)
    out.print(Group(*parts))
