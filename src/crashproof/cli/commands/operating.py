"""`crashproof cancel`: an operator stops a run for good (runtime/operations/cancelling.py).

``crashproof.cli.app`` registers it at the top level.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from crashproof.cli.exitcodes import ExitCode
from crashproof.cli.render import emit_json, safe
from crashproof.cli.settings import (
    DbOption,
    JsonOption,
    VerboseOption,
    command_settings,
    open_ledger,
)

__all__ = ["cancel_run"]


def cancel_run(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to cancel.")
    ],
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            metavar="NAME",
            show_default=False,
            help="Who cancels the run, journaled (default: the OS user).",
        ),
    ] = None,
    reason: Annotated[
        str,
        typer.Option("--reason", metavar="TEXT", help="Why, journaled with the cancel."),
    ] = "",
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Cancel a run for good: journaled (who, when, why), its lease taken over so a worker
    driving it can write nothing more. An act in flight is left to reconciliation (shown
    by `crashproof show`). resume, retry, the worker and run with the same id then refuse
    it (exit 7). A run that has ended is refused (exit 4), nothing written."""
    settings = command_settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        record = ledger.cancel(run_id, by=by, reason=reason)
    if settings.json:
        emit_json({"run_id": run_id, **record})
    else:
        flight = record.get("in_flight") or []
        left = f"; left in flight for reconciliation: {', '.join(flight)}" if flight else ""
        sys.stderr.write(safe(f"cancelled {run_id} as {record['by']}{left}") + "\n")
    return int(ExitCode.OK)
