"""`crashproof cancel` (an operator stops a run for good: runtime/operations/cancelling.py)
and `crashproof dispatch` (pending outbox messages delivered: nothing pending in silence).

``crashproof.cli.app`` registers both at the top level.
"""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Any

import typer

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.loading import app_tools
from crashproof.cli.render import emit_json, safe, undelivered
from crashproof.cli.settings import (
    ByOption,
    DbOption,
    JsonOption,
    VerboseOption,
    command_settings,
    open_ledger,
)

__all__ = ["cancel_run", "dispatch_outbox", "fork_run"]


def cancel_run(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to cancel.")
    ],
    by: ByOption = None,
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


def dispatch_outbox(
    ctx: typer.Context,
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[RUN_ID]...", show_default=False, help="Only these runs (default: all)."
        ),
    ] = None,
    app_modules: Annotated[
        list[str] | None,
        typer.Option(
            "--app",
            metavar="MODULE",
            show_default=False,
            help="Module whose outbox tools deliver the messages. Repeatable.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Deliver the pending outbox messages of runs no process drives (a target that was
    down when the run ended). Each delivery is journaled once; a failed one stays pending.
    Exits 8 while messages remain undelivered, 0 once none do."""
    from crashproof.tools.outbox import Outbox

    settings = command_settings(ctx, db, as_json, verbose)
    tools = [tool for tool in app_tools(app_modules or []) if isinstance(tool, Outbox)]
    if not tools:
        raise CliError(
            ExitCode.USAGE,
            "no outbox tool to deliver with; nothing was delivered",
            "pass --app MODULE naming the module that defines the run's cp.Outbox",
        )
    with open_ledger(settings, create=False) as ledger:
        for run_id in run_ids or []:
            ledger.get_run(run_id)  # an unknown run id: RunNotFound, exit 2
        delivered = ledger.dispatch_outbox(tools, run_ids or None)
        infos = [ledger.get_run(r) for r in run_ids] if run_ids else ledger.runs()
    left = {info.run_id: n for info in infos if (n := undelivered(info))}
    if settings.json:
        emit_json({"delivered": delivered, "undelivered": left})
    else:
        still = f"; still undelivered: {sum(left.values())} in {', '.join(left)}" if left else ""
        sys.stderr.write(safe(f"{delivered} message(s) delivered{still}") + "\n")
    return int(ExitCode.UNDELIVERED if left else ExitCode.OK)


def fork_run(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to fork.")
    ],
    from_step: Annotated[
        str,
        typer.Option(
            "--from", metavar="STEP", show_default=False, help="The last step the fork keeps."
        ),
    ],
    new_run_id: Annotated[
        str,
        typer.Option("--run-id", metavar="NEW", show_default=False, help="The new run's id."),
    ],
    by: ByOption = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Only list the acts that would run again; fork nothing."),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Start run NEW from RUN's journal up to and including step STEP (its acts keep their
    receipts and operation ids; later acts get NEW's). Lists first the acts that will run
    again (the source's acts after STEP: a resume of NEW executes them live); --dry-run
    lists them and forks nothing. `crashproof resume NEW --app M` replays the prefix and
    runs the rest live. Refused inside an act (exit 4)."""
    settings = command_settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        again = ledger.fork_preview(run_id, from_step=from_step)
        if dry_run:
            if settings.json:
                emit_json({"run_id": run_id, "from_step": from_step, "run_again": again})
            else:
                _list_again(again, dry_run)
            return int(ExitCode.OK)
        record = ledger.fork(run_id, from_step=from_step, new_run_id=new_run_id, by=by)
    if not settings.json:
        _list_again(again, dry_run)
    if settings.json:
        emit_json({"run_id": new_run_id, **record, "run_again": again})
    else:
        sys.stderr.write(
            safe(
                f"forked {run_id} at {from_step} into {new_run_id} as {record['by']}; "
                f"`crashproof resume {shlex.quote(new_run_id)} --app MODULE` drives it on"
            )
            + "\n"
        )
    return int(ExitCode.OK)


def _list_again(again: list[dict[str, Any]], dry_run: bool) -> None:
    head = "a fork would run again" if dry_run else "the fork will run again"
    if not again:
        sys.stderr.write(f"{head}: no act (nothing after that step was sent anywhere)\n")
        return
    sys.stderr.write(f"{head} {len(again)} act(s), live, under the new run's ids:\n")
    for act in again:
        sys.stderr.write(
            safe(
                f"  {act['step']}  tool {act['tool'] or '?'}, was {act['operation_id']} "
                f"({act['ended']})"
            )
            + "\n"
        )
