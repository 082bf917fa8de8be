"""The crash matrix as people read it: one row per crash point, its outcome, the outcomes
of the crashes during its recovery, effect counts and model calls; then every REFUSED
reason and DIVERGED explanation, with the seed that replays them.

Builds rich renderables (the CLI prints them) and plain text (for assertion messages).
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from crashproof.verify.report import CaseKind, CaseResult, Report, Verdict

__all__ = [
    "kind_counts_line",
    "matrix_table",
    "print_report",
    "render_report",
    "report_text",
    "summary_line",
]

_STYLE = {Verdict.SAME: "green", Verdict.REFUSED: "yellow", Verdict.DIVERGED: "bold red"}
_LETTER = {Verdict.SAME: "S", Verdict.REFUSED: "R", Verdict.DIVERGED: "D"}


def _verdict(verdict: Verdict, short: bool = False) -> Text:
    return Text(_LETTER[verdict] if short else verdict.value, style=_STYLE[verdict])


def _short_op(op: str, run_id_prefix: str) -> str:
    return op[len(run_id_prefix) :] if op.startswith(run_id_prefix) else op


def _effects(result: CaseResult, report: Report) -> Text:
    reference = report.reference.effects
    if reference is None or result.effects is None:
        return Text("-", style="dim")
    if not result.extra_effects:
        once = all(n == 1 for n in reference.values())
        return Text(f"{len(reference)} x1" if once else "= ref")
    prefix = _run_prefix(report)
    parts = [f"{_short_op(op, prefix)} {n:+d}" for op, n in sorted(result.extra_effects.items())]
    worse = any(n > 0 for n in result.extra_effects.values())
    return Text(", ".join(parts), style="bold red" if worse else "yellow")


def _run_prefix(report: Report) -> str:
    ops = list(report.reference.effects or {})
    if not ops:
        return ""
    head = ops[0].rpartition("/")[0]
    return head + "/" if all(op.startswith(head + "/") for op in ops) else ""


def _calls(result: CaseResult) -> Text:
    if result.model_calls is None:
        return Text("-", style="dim")
    text = Text(str(result.model_calls))
    if result.reasked:
        text.append(f" (+{', '.join(result.reasked)})", style="dim")
    return text


def matrix_table(report: Report) -> Table:
    """One row per crash point tried: crash point x outcome, then crashes in recovery."""
    doubles: dict[int, list[CaseResult]] = {}
    for r in report.of_kind(CaseKind.DOUBLE_CRASH):
        doubles.setdefault(r.case.at, []).append(r)
    width = max((len(v) for v in doubles.values()), default=0)
    title = (
        f"crash matrix: {report.scenario} ({report.mode}"
        f"{', SIGKILL' if report.mode == 'subprocess' else ''}), seed {report.seed}"
    )
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),  # narrow: rows fit 80 columns
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("crash point", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    if width:
        table.add_column("recovery", no_wrap=True)
    table.add_column("effects", overflow="fold", min_width=7)
    table.add_column("model calls", overflow="fold", min_width=6)
    for r in report.of_kind(CaseKind.CRASH):
        row: list[RenderableType] = [str(r.case.at), Text(r.case.point), _verdict(r.verdict)]
        if width:
            cells = Text()
            for d in doubles.get(r.case.at, []):
                cells.append_text(_verdict(d.verdict, short=True))
                cells.append(" ")
            row.append(cells if cells.plain else Text("-", style="dim"))
        row += [_effects(r, report), _calls(r)]
        table.add_row(*row)
    labels = {CaseKind.REFERENCE: "no crash (reference)", CaseKind.REDELIVERY: "delivered again"}
    for kind, label in labels.items():
        for r in report.of_kind(kind):
            row = ["-", Text(label, style="italic"), _verdict(r.verdict)]
            if width:
                row.append(Text(""))
            row += [_effects(r, report), _calls(r)]
            table.add_row(*row)
    return table


def summary_line(report: Report) -> Text:
    counts = report.counts()
    crashes = len(report.of_kind(CaseKind.CRASH))
    doubles = len(report.of_kind(CaseKind.DOUBLE_CRASH))
    total = len(report.reference.points)
    tried = f"all {total}" if crashes == total else f"{crashes} (sampled) of {total}"
    cases = f"{tried} crash points" + (f", {doubles} double crashes" if doubles else "")
    two = len(report.of_kind(CaseKind.TWO_RECOVERERS))
    stale = len(report.of_kind(CaseKind.STALE_CHECKPOINT))
    if two or stale:
        cases += f", {two} two-recoverers cases, {stale} stale checkpoints"
    text = Text(f"{cases}, a redelivery: ", style="bold")
    for verdict in Verdict:
        text.append_text(_verdict(verdict))
        text.append(f" {counts[verdict.value]}  ")
    text.append(f"({report.seconds:.1f} s)", style="dim")
    return text


def chaos_line(report: Report) -> Text:
    """Chaos mode: what the kills hit and what came of them."""
    c = report.chaos_counts()
    text = Text("chaos: ", style="bold")
    text.append(
        f"{c['trials']} trials, {c['kills']} kills ({c['kills_during_tool_child']} while a "
        f"tool's child process ran), {c['double_crashes']} double crashes, "
        f"{c['finished_before_kill']} finished before their kill; duplicated "
        f"{c['duplicated']}, lost {c['lost']}, re-asked {c['reasked']}, stuck {c['stuck']}, "
        f"diverged {c['diverged']}"
    )
    if c["worker_trials"] or c["outages"] or c["power_cut_trials"] or c["store_restart_trials"]:
        text.append(
            f"; {c['worker_trials']} worker trials ({c['taken_over_by_a_worker']} taken over "
            f"by the next worker), {c['outages']} model outages ({c['stopped_by_outage']} "
            f"stopped the run, {c['resumed_by_a_worker']} automatic resumes by a worker), "
            f"{c['power_cut_trials']} power-cut trials ({c['power_cuts']} cuts, "
            f"{c['cuts_that_lost_writes']} of them lost unsynced writes), "
            f"{c['store_restart_trials']} store-restart trials ({c['store_restarts']} "
            f"before the worker ended, {c['drives_a_restart_stopped']} stopped its drive)"
        )
    return text


def kind_counts_line(report: Report) -> Text:
    """Outcomes per case kind: ``crash: SAME 68 ... | two-recoverers: SAME 6 ...``."""
    text = Text("per kind: ", style="bold")
    for i, (kind, counts) in enumerate(report.kind_counts().items()):
        if i:
            text.append(" | ", style="dim")
        text.append(f"{kind} ")
        shown = [v for v in Verdict if counts[v.value]] or [Verdict.SAME]
        for j, verdict in enumerate(shown):
            if j:
                text.append(" ")
            text.append_text(_verdict(verdict, short=True))
            text.append(f" {counts[verdict.value]}")
    return text


def _details(report: Report) -> list[Text]:
    lines = []
    for r in report.results:
        if r.verdict is Verdict.SAME:
            continue
        line = _verdict(r.verdict)
        line.append(f" {r.case.label}: ", style="bold")
        line.append(r.reason or "-")
        lines.append(line)
    return lines


def print_report(console: Console, report: Report) -> None:
    """Print the header, the matrix and the summary; then, one line each, never wrapped (they
    are searched and copied), every REFUSED reason and DIVERGED explanation and, after a
    divergence, the seed and the command that replays it."""
    console.print(render_report(report))
    for line in _details(report):
        console.print(line, soft_wrap=True)
    if report.diverged:
        replay = f"seed {report.seed}; replay with: {report.repro()}"
        console.print(Text(replay, style="bold red"), soft_wrap=True)


def render_report(report: Report) -> Group:
    """Header, matrix and summary (``print_report`` adds the details)."""
    ref = report.reference
    header = Text()
    header.append(f"reference run of {report.scenario}: ", style="bold")
    header.append(
        f"{len(ref.points)} crash points, {len(ref.effects or {})} effects, "
        f"{sum((ref.model_calls or {}).values())} model calls, {ref.seconds * 1000:.0f} ms\n"
    )
    header.append("fingerprint ")
    header.append(ref.fingerprint, style="bold")
    if report.mode == "chaos":  # no crash points to tabulate: one line of counts
        return Group(header, chaos_line(report), kind_counts_line(report))
    return Group(header, matrix_table(report), summary_line(report), kind_counts_line(report))


def report_text(report: Report, width: int = 160) -> str:
    """The rendered report as plain text (no colour), e.g. for an assertion message."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False)
    print_report(console, report)
    return out.getvalue()
