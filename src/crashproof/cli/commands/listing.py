"""`crashproof runs`: finding runs, newest first, by status, workflow and time.

Each run listed is folded from its verified journal. A run whose journal fails
verification (an altered record, a rollback, a lost witness) is listed too, marked
``refused`` with the reason, and the command exits 5 after listing the rest: one bad run
never hides the others, and a script still learns that something is wrong.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from crashproof.cli.commands.versions import print_versions
from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.render import console, emit_json, lease_json, print_runs
from crashproof.cli.settings import (
    DbOption,
    JsonOption,
    VerboseOption,
    command_settings,
    open_ledger,
)
from crashproof.journal.records import RunInfo, RunStatus
from crashproof.runtime.operations.browse import RunsPage, parse_when, run_list
from crashproof.runtime.operations.folds import Folds, RefusedRun

__all__ = ["list_runs"]

DEFAULT_LIMIT = 50


def list_runs(
    ctx: typer.Context,
    status: Annotated[
        RunStatus | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            show_default=False,
            help=f"Only runs with this status: {', '.join(s.value for s in RunStatus)}.",
        ),
    ] = None,
    workflow: Annotated[
        str | None,
        typer.Option("--workflow", metavar="NAME", help="Only runs of this workflow."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="WHEN",
            help="Only runs updated since: an age (30m, 2h, 7d) or an ISO date or time "
            "(2026-12-05, 2026-12-05T10:00; UTC unless it names a zone).",
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit", metavar="N", help="List at most N runs, newest first; 0 lists all."
        ),
    ] = DEFAULT_LIMIT,
    by_version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Count the runs in flight (not ended) per workflow name and version: an "
            "old version can be retired when no run is left on it.",
        ),
    ] = False,
    drifted: Annotated[
        bool,
        typer.Option(
            "--drifted",
            help="Only runs with an act whose latest journaled reconciliation found it "
            "drifted (crashproof reconcile --record, worker --reconcile-every).",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """List the runs in the ledger, newest update first (--limit of them)."""
    settings = command_settings(ctx, db, as_json, verbose)
    if limit < 0:
        raise CliError(ExitCode.USAGE, f"--limit {limit} is negative", "give 0 (all) or more")
    try:
        after = None if since is None else parse_when(since)
    except ValueError as exc:
        raise CliError(
            ExitCode.USAGE, f"--since {exc}", "e.g. --since 2h or --since 2026-12-05"
        ) from None
    whole = by_version or drifted  # counted or filtered over every run, then cut
    with open_ledger(settings, create=False) as ledger:
        found = run_list(
            ledger,
            Folds(),
            status=status,
            workflow=workflow,
            since=after,
            limit=None if whole or limit == 0 else limit,
        )
        leases = ledger.leases()
    infos = list(found.runs)
    if drifted:
        infos = [info for info in infos if info.drifted]
    if by_version:  # oldest first: a group names its oldest run
        print_versions(settings.json, sorted(infos, key=lambda i: (i.created_at, i.run_id)))
        return _refusals(found)
    if limit and len(infos) > limit:
        infos = infos[:limit]
    shown = RunsPage(
        runs=tuple(infos),
        total=found.total,
        offset=0,
        limit=limit,
        workflows=(),
        refused=found.refused,
        undelivered=found.undelivered,
    )
    if settings.json:
        emit_json(
            [_refused_json(bad) for bad in shown.refused]
            + [
                lease_json(_run_json(info, shown.undelivered), leases.get(info.run_id))
                for info in shown.runs
            ]
        )
    else:
        print_runs(console(), shown, status.value if status else None, leases, shown.undelivered)
    listed = len(shown.runs) + len(shown.refused)
    if limit and not whole and listed >= limit and found.total > listed:
        sys.stderr.write(
            f"showing the newest {listed} of {found.total} runs: --limit N shows more, "
            "--limit 0 all\n"
        )
    return _refusals(found)


def _run_json(info: RunInfo, undelivered: dict[str, int]) -> dict[str, Any]:
    """A run's record without its steps (``crashproof show RUN --json`` has them): a
    listing of ten thousand runs stays a listing."""
    record = {name: value for name, value in info.to_json().items() if name != "steps"}
    return {**record, "undelivered": undelivered.get(info.run_id, 0)}


def _refused_json(bad: RefusedRun) -> dict[str, Any]:
    return {
        "run_id": bad.run_id,
        "workflow": bad.workflow,
        "version": bad.version,
        "status": bad.status,  # the index row's: the journal did not confirm it
        "updated_at": bad.updated_at,
        "refused": {"error": bad.error, "reason": bad.reason},
    }


def _refusals(found: RunsPage) -> int:
    """Exit 5 (documented) after listing, when some runs fail verification."""
    if not found.refused:
        return int(ExitCode.OK)
    n = len(found.refused)
    sys.stderr.write(
        f"crashproof: error: {n} run(s) fail verification and are listed as refused; "
        "nothing of them was shown or changed\n"
        "hint: `crashproof check` says why for each; restore the ledger and its witness "
        "from a backup (or `crashproof reanchor RUN --by NAME` if only the witness was "
        "lost and you trust the journal)\n"
    )
    return int(ExitCode.LEDGER_UNUSABLE)
