"""Everything the CLI prints: rich tables for people, plain JSON for scripts, error lines.

User data (run ids, reasons, error messages) is always wrapped in ``Text`` so a
``[bracket]`` in it is printed as is, never read as rich markup. And none of it reaches
the terminal as a control character: a run id, a reason or a recorded value holding
``ESC[2J`` (clear the screen), an OSC 52 clipboard write or a bidirectional override is
printed as ``\\x1b[2J``, ``\\u202e``. The console every command prints with escapes
them in every segment it renders (``console()``), error lines and plain writes go
through ``safe()``, and JSON output carries them as JSON's own escapes.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.highlighter import JSONHighlighter
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from crashproof.cli.exitcodes import Failure
from crashproof.journal.controls import CONTROLS, safe
from crashproof.journal.fold import tokens_of
from crashproof.journal.records import RunInfo, RunStatus, StepInfo, StepStatus
from crashproof.runtime.operations.browse import RunsPage
from crashproof.runtime.operations.folds import RefusedRun
from crashproof.runtime.steps.reconcile import ActCheck
from crashproof.store.queue import LeaseInfo, retryable_stop

__all__ = [
    "console",
    "emit_json",
    "print_error",
    "print_run",
    "print_runs",
    "run_summary",
    "undelivered",
    "runs_table",
    "safe",
    "steps_table",
]

_STATUS_STYLE = {
    RunStatus.QUEUED.value: "dim",
    RunStatus.RUNNING.value: "cyan",
    RunStatus.SUCCEEDED.value: "green",
    RunStatus.FAILED.value: "bold red",
    RunStatus.AWAITING_APPROVAL.value: "magenta",
    RunStatus.NEEDS_REVIEW.value: "bold yellow",
    RunStatus.STOPPED.value: "yellow",
    RunStatus.CANCELLED.value: "dim",
    RunStatus.MOVED.value: "blue",
    StepStatus.UNKNOWN.value: "bold magenta",
}
_DASH = Text("-", style="dim")


_CONTROLS = CONTROLS
_JSON_CONTROLS = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # json escapes C0


class _SafeConsole(Console):
    """A rich console that never writes a control character of the data it renders.

    Every ``Text`` a command prints holds data from the ledger (run ids, reasons, recorded
    values); escaping each segment as it is rendered covers all of them at once, the ones
    a later table adds too. Styles and cursor moves are control segments of rich's own,
    left as they are."""

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _CONTROLS.search(segment.text):
                yield Segment(safe(segment.text), segment.style)
            else:
                yield segment


def console(*, stderr: bool = False) -> Console:
    """A console on the current ``sys.stdout`` (so in-process callers can capture it)."""
    return _SafeConsole(highlight=False, soft_wrap=False, stderr=stderr)


def emit_json(data: Any) -> None:
    """Machine-readable output: indented JSON on stdout, nothing else."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    text = _JSON_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)  # same value
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_error(failure: Failure) -> None:
    """``crashproof: error: ...`` and ``hint: ...`` on stderr, plain text."""
    sys.stdout.flush()
    sys.stderr.write(f"crashproof: error: {safe(failure.message)}\n")
    if failure.hint:
        sys.stderr.write(f"hint: {safe(failure.hint)}\n")
    sys.stderr.flush()


def _status(value: str) -> Text:
    return Text(value, style=_STATUS_STYLE.get(value, ""))


def undelivered(info: RunInfo) -> int:
    """How many of the run's outbox messages are still pending (``crashproof dispatch``)."""
    return sum(1 for step in info.steps if step.delivery == "pending")


def _run_status(info: RunInfo) -> Text:
    """The run's status, marked when messages are pending: ``succeeded (1 undelivered)``."""
    text = _status(info.status.value)
    pending = undelivered(info)
    if pending:
        text.append(f" ({pending} undelivered)", style="bold yellow")
    if info.drifted:  # the latest journaled reconciliation (crashproof reconcile --record)
        text.append(f" ({len(info.drifted)} drifted)", style="bold red")
    return text


def _local(ts: float) -> dt.datetime | None:
    """``ts`` as a local time; None when no calendar holds it (a file edited to year
    287168, a NaN): shown as the number it is, never a crash."""
    try:
        return dt.datetime.fromtimestamp(ts).astimezone()
    except (ValueError, OverflowError, OSError):
        return None


def _time(ts: float | None) -> str:
    if ts is None:
        return "-"
    when = _local(ts)
    return f"{ts!r} (not a date)" if when is None else when.strftime("%Y-%m-%d %H:%M:%S")


def _short_time(ts: float) -> str:
    """Like ``ls -l``: the time of day for today, else the date."""
    when = _local(ts)
    if when is None:
        return f"{ts!r} (not a date)"
    if when.date() == dt.datetime.now().astimezone().date():
        return when.strftime("%H:%M:%S")
    return when.strftime("%Y-%m-%d %H:%M")


def _cost(cost: float | None) -> Text:
    return _DASH if not cost else Text(f"{cost:.4f}")


def _count(n: int | None) -> Text:
    return _DASH if not n else Text(str(n))


def _clip(text: str, width: int, style: str = "") -> Text:
    """One line of at most ``width`` characters (tables stay readable; ``show`` has it all)."""
    text = safe(" ".join(text.split()))
    if len(text) > width:
        text = text[: width - 1] + "…"
    return Text(text, style=style)


def _error_summary(error: dict[str, Any] | None) -> Text:
    if not error:
        return Text("")
    kind = str(error.get("type", "Error")).rpartition(".")[2]
    return _clip(f"{kind}: {error.get('message', '')}", 60, "red")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _budget(info: RunInfo) -> str:
    b = info.budget
    return (
        f"{_plural(b.steps, 'step')}, {_plural(b.decisions, 'decision')}, "
        f"{_plural(b.tokens, 'token')}, cost {b.cost:.4f}"
        + (f", {info.unknowns} unknown outcome(s)" if info.unknowns else "")
    )


def run_summary(info: RunInfo) -> str:
    """One line for stderr after run/resume: what happened and what it cost."""
    b = info.budget
    parts = [_plural(b.steps, "step")]
    if b.decisions:
        parts.append(_plural(b.decisions, "decision"))
    if b.tokens:
        parts.append(f"{b.tokens} tokens")
    if b.cost:
        parts.append(f"cost {b.cost:.4f}")
    return (
        f"crashproof: run {info.run_id!r} ({info.workflow}@{info.version}) "
        f"{info.status.value}: {', '.join(parts)}"
    )


def _table(title: str) -> Table:
    # Compact: rows must fit an 80-column terminal (or a pipe, which rich treats as 80);
    # SIMPLE_HEAD's column separator is itself a space, so cells need no padding.
    return Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False
    )


def _lease_cells(
    lease: LeaseInfo | None, status: str, reason: str | None = None
) -> list[RenderableType]:
    """Owner and lease of a run: held until T, or expired at T (orphaned: its worker is
    gone or stalled; any worker takes it over); for a run stopped for a retryable cause
    and held by nobody, when a worker tries it next."""
    if lease is not None and lease.owner is None and retryable_stop(status, reason):
        return [_DASH, Text(_next_attempt(lease), style="yellow")]
    if lease is None or lease.owner is None:
        waiting = status == "running" and lease is not None
        return [_DASH, Text("none: waiting for a worker", style="yellow") if waiting else _DASH]
    expires = lease.expires_at or 0.0
    if expires > time.time():
        return [Text(safe(lease.owner)), Text(f"until {_short_time(expires)}")]
    what = "orphaned, expired" if status == "running" else "expired"
    return [Text(safe(lease.owner)), Text(f"{what} {_short_time(expires)}", style="red")]


def next_attempt_at(lease: LeaseInfo | None) -> float | None:
    """When a worker tries a retryably stopped run next (None: as soon as one polls)."""
    if lease is None or lease.retry_at is None or lease.retry_at <= time.time():
        return None
    return lease.retry_at


def _next_attempt(lease: LeaseInfo) -> str:
    at = next_attempt_at(lease)
    when = "next attempt: now" if at is None else f"next attempt {_short_time(at)}"
    return when + (f" (retry {lease.retries + 1})" if lease.retries else "")


def retry_line(retry: Mapping[str, Any]) -> str:
    """``crashproof show`` of a retryably stopped run: who resumes it, and when."""
    at = retry.get("next_attempt_at")
    when = "as soon as one polls" if at is None else f"at {_short_time(float(at))}"
    done = retry.get("retries") or 0
    return (
        f"retryable stop: a worker (crashproof worker) resumes it {when}"
        + (f", after {done} automatic attempt{'s' if done != 1 else ''}" if done else "")
        + "; nobody needs to type resume"
    )


def _owner(leases: Mapping[str, LeaseInfo], run_id: str) -> str | None:
    lease = leases.get(run_id)
    return None if lease is None else lease.owner


def lease_json(record: dict[str, Any], lease: LeaseInfo | None) -> dict[str, Any]:
    """A run's ``--json`` record with its owner and lease expiry (epoch seconds); for a
    run stopped for a retryable cause, ``retryable``, ``next_attempt_at`` (epoch seconds;
    null: as soon as a worker polls) and ``retries`` (automatic attempts so far)."""
    owner = None if lease is None else lease.owner
    expires = None if lease is None or owner is None else lease.expires_at
    retry = retry_json(str(record.get("status")), record.get("reason"), lease)
    return {**record, "owner": owner, "lease_expires_at": expires, **retry}


def retry_json(status: str, reason: str | None, lease: LeaseInfo | None) -> dict[str, Any]:
    """For a run stopped for a retryable cause: ``retryable``, ``next_attempt_at`` (epoch
    seconds; null: as soon as a worker polls), ``retries``; else nothing."""
    if not retryable_stop(status, reason):
        return {}
    retries = 0 if lease is None else lease.retries
    return {"retryable": True, "next_attempt_at": next_attempt_at(lease), "retries": retries}


def runs_table(
    infos: Sequence[RunInfo],
    leases: Mapping[str, LeaseInfo] | None = None,
    *,
    width: int = 80,
    pending: Mapping[str, int] | None = None,
    refused: Sequence[RefusedRun] = (),
) -> Table:
    """``crashproof runs``: one row per run (with ``leases``: owner and lease too), the
    runs whose journal fails verification first, marked ``refused``. ``pending``: the
    undelivered outbox messages per run. On a narrow terminal the counting columns go
    first, then the workflow: the run id, its status and its lease always stay."""
    table = _table(_plural(len(infos) + len(refused), "run"))
    if leases is not None and not any(
        info.status is RunStatus.RUNNING
        or _owner(leases, info.run_id)
        or retryable_stop(info.status.value, info.reason)
        for info in infos
    ):
        leases = None  # every run ended and nobody holds one: no columns to show
    counts = width >= (130 if leases is not None else 80)
    named = width >= (90 if leases is not None else 60)
    table.add_column("run id", overflow="fold", style="bold", min_width=min(24, width // 4))
    if named:
        table.add_column("workflow", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("reason", overflow="fold", min_width=8)
    if counts:
        for name in ("steps", "decisions", "tokens", "cost"):
            table.add_column(name, justify="right", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    if leases is not None and counts:
        table.add_column("owner", overflow="fold")
        table.add_column("lease", no_wrap=True)
    elif leases is not None:  # narrow: owner over lease in one column, never dropped
        table.add_column("owner, lease", overflow="fold", min_width=14)
    for bad in refused:
        table.add_row(
            Text(safe(bad.run_id)),
            *([Text(safe(f"{bad.workflow}@{bad.version}"))] if named else []),
            Text("refused", style="bold red"),
            _clip(f"{bad.error}: {bad.reason}", 60),
            *([_DASH] * 4 if counts else []),
            _short_time(bad.updated_at),
            *(_lease_row(None, "refused", counts) if leases is not None else []),
        )
    for info in infos:
        b = info.budget
        status = _run_status(info)
        waiting = (pending or {}).get(info.run_id, 0)
        if waiting:
            status.append(f" ({waiting} undelivered)", style="bold yellow")
        table.add_row(
            Text(safe(info.run_id)),
            *([Text(safe(f"{info.workflow}@{info.version}"))] if named else []),
            status,
            _clip(info.reason or "", 40),
            *(
                [Text(str(b.steps)), _count(b.decisions), _count(b.tokens), _cost(b.cost)]
                if counts
                else []
            ),
            _short_time(info.updated_at),
            *(
                []
                if leases is None
                else _lease_row(leases.get(info.run_id), info.status.value, counts, info.reason)
            ),
        )
    return table


def _lease_row(
    lease: LeaseInfo | None, status: str, apart: bool, reason: str | None = None
) -> list[RenderableType]:
    """The lease cells of a runs row: owner and lease apart, or one over the other."""
    cells = _lease_cells(lease, status, reason)
    if apart:
        return cells
    owner, held = (cell if isinstance(cell, Text) else Text(str(cell)) for cell in cells)
    return [Text("\n").join([owner, held]) if owner.plain != "-" else held]


def print_runs(
    out: Console,
    found: RunsPage,
    status: str | None,
    leases: Mapping[str, LeaseInfo] | None = None,
    pending: Mapping[str, int] | None = None,
) -> None:
    if found.runs or found.refused:
        table = runs_table(
            found.runs, leases, width=out.width, pending=pending, refused=found.refused
        )
        out.print(table)
        return
    which = f" with status {status}" if status else ""
    out.print(Text(f"no runs{which} in this ledger", style="dim"))


def _step_row(step: StepInfo) -> list[RenderableType]:
    duration = step.duration
    return [
        Text(safe(step.key)),
        Text(step.kind.value),
        # An unknown outcome settled as not done (cp.OnUnknown, a review's keep): not an error.
        Text("not done", style="yellow")
        if step.failure == "not_done"
        else _status(step.status.value),
        Text(str(step.attempts)),
        _DASH if duration is None else Text(f"{duration * 1000:.1f}"),
        _DASH if not step.model else Text(safe(step.model)),
        _count(tokens_of(step.usage)),
        _cost(step.cost),
        _error_summary(step.error),
    ]


def steps_table(steps: Sequence[StepInfo]) -> Table:
    """``crashproof show``: the run's recorded steps, in journal order."""
    table = _table("steps")
    table.add_column("step", overflow="fold", style="bold", min_width=8)
    table.add_column("kind", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("attempts", justify="right", no_wrap=True)
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("model", overflow="fold", min_width=6)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("cost", justify="right", no_wrap=True)
    table.add_column("error", overflow="fold")
    for step in steps:
        table.add_row(*_step_row(step))
    return table


def _header(info: RunInfo) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    rows: list[tuple[str, RenderableType]] = [
        ("run", Text(safe(info.run_id), style="bold")),
        ("workflow", Text(safe(info.workflow))),
        ("version", Text(safe(info.version))),
        ("status", _run_status(info)),
        ("reason", Text(safe(info.reason or "-"))),
        ("input digest", Text(info.input_digest)),
        ("budget", Text(_budget(info))),
        ("created", Text(_time(info.created_at))),
        ("updated", Text(_time(info.updated_at))),
    ]
    verified = _verified(info)
    if verified:
        rows.insert(5, ("verified", Text(safe(verified), style="green")))
    reconciled = _reconciled(info)
    if reconciled:
        rows.insert(5, ("reconciled", Text(safe(reconciled), style="red" if info.drifted else "")))
    for label, value in rows:
        grid.add_row(label, value)
    return grid


def _reconciled(info: RunInfo) -> str | None:
    """The latest journaled reconciliation in one line: when, by whom, and the drift."""
    if not info.reconciled:
        return None
    latest = max(info.reconciled.values(), key=lambda f: float(f.get("time") or 0))
    when = _time(float(latest.get("time") or 0))
    drift = f"; drifted: {', '.join(info.drifted)}" if info.drifted else "; nothing drifted"
    return f"{len(info.reconciled)} act(s), latest {when} by {latest.get('by')}{drift}"


def _verified(info: RunInfo) -> str | None:
    """A succeeded run's completion evidence in one line: which check, at which states."""
    completion = (info.evidence or {}).get("completion")
    if info.status is not RunStatus.SUCCEEDED or not isinstance(completion, dict):
        return None
    parts = []
    for check in completion.get("checks") or []:
        states = ", ".join(
            f"{env.get('instance')} @ {str(env.get('fingerprint'))[:12]}"
            for env in check.get("environments") or []
        )
        parts.append(f"{check.get('step')} passed at {states or 'no observed environment'}")
    return "; ".join(parts) or None


def _json_panel(title: str, value: Any, style: str) -> Panel:
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    # Text, not rich.json.JSON: long strings (digests, messages) fold instead of being cut.
    body = Text(safe(text), overflow="fold")
    JSONHighlighter().highlight(body)
    return Panel(body, title=title, title_align="left", border_style=style, expand=False)


def print_run(out: Console, info: RunInfo) -> None:
    """``crashproof show``: header, step timeline, then result / error / evidence."""
    parts: list[RenderableType] = [_header(info), Text("")]
    if info.input:
        parts.append(_json_panel("input", info.input, "dim"))
    if info.steps:
        parts.append(steps_table(info.steps))
    else:
        parts.append(Text("no steps recorded", style="dim"))
    if info.status is RunStatus.SUCCEEDED:
        parts.append(_json_panel("result", info.result, "green"))
    if info.error is not None:
        parts.append(_json_panel("error", info.error, "red"))
    if info.evidence is not None:
        parts.append(_json_panel("evidence", info.evidence, "yellow"))
    if info.humans:  # signed approvals / review decisions, expired ones included
        parts.append(_json_panel("approvals and decisions", list(info.humans), "cyan"))
    out.print(Group(*parts))


def print_checks(out: Console, checks: Sequence[ActCheck]) -> None:
    """The reconcile report: one row per recorded act."""
    if not checks:
        out.print("no recorded acts")
        return
    colours = {"confirmed": "green", "drifted": "red", "needs_review": "yellow"}
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("run", "step", "tool", "status", "detail"):
        table.add_column(column)
    for check in checks:
        colour = colours.get(check.status, "white")
        table.add_row(
            Text(safe(check.run_id)),
            Text(safe(check.step)),
            Text(safe(check.tool)),
            Text(check.status, style=colour),
            Text(safe(check.detail)),
        )
    out.print(table)
