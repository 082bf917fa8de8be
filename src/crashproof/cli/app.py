"""The typer application: the root callback, and every command registered by name.

The commands are plain functions in ``crashproof.cli.commands``; this module is the
only one that knows ``app``, so nothing under ``crashproof.cli`` imports it back.
Registration order is the order ``crashproof --help`` lists the commands in (typer
lists a Typer's own commands first, then its groups, each in registration order).

Commands raise; ``crashproof.cli.main`` turns every error into one error line, one
hint line and an exit code (see ``crashproof.cli.exitcodes``).
"""

from __future__ import annotations

import platform
import sys
from typing import Annotated

import typer

from crashproof._version import __version__
from crashproof.cli.commands import (
    approvals,
    console,
    integrity,
    listing,
    operating,
    proofs,
    review,
    runs,
    transfer,
    versions,
    workers,
)
from crashproof.cli.exitcodes import EXIT_CODES_TEXT, SIGNAL_EXIT_TEXT
from crashproof.cli.settings import DbOption, JsonOption, State, VerboseOption

__all__ = ["app"]


def _epilog() -> str:
    # Rendered as Markdown by typer's rich help: a table keeps the codes aligned.
    rows = [f"| {int(code)} | {text} |" for code, text in EXIT_CODES_TEXT.items()]
    rows.append(f"| 128+N | {SIGNAL_EXIT_TEXT} |")  # the OS's code, never ours
    return "\n".join(["| exit code | meaning |", "|---:|:---|", *rows])


app = typer.Typer(
    name="crashproof",
    epilog=_epilog(),
    add_completion=False,
    rich_markup_mode="markdown",  # joins hard-wrapped docstring lines into paragraphs
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(shown: bool) -> None:
    if shown:
        sys.stdout.write(f"crashproof {__version__} (Python {platform.python_version()})\n")
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Crash-proof runs of AI agents: start them, inspect them, resume them.

    --db, --json and --verbose work before or after the command
    (crashproof --db X runs, or crashproof runs --db X).
    """
    state = ctx.ensure_object(State)
    state.db, state.json, state.verbose = db, as_json, verbose


# Each command's help is its function's docstring, as typer reads it at registration.
app.command("run")(runs.start_run)
app.command("resume")(runs.resume_run)
app.command("retry")(runs.retry_run)
app.command("cancel")(operating.cancel_run)
app.command("fork")(operating.fork_run)
app.command("dispatch")(operating.dispatch_outbox)
app.command("runs")(listing.list_runs)
app.command("show")(runs.show_run)
app.command("reconcile")(runs.reconcile_runs)
app.command("approve")(approvals.approve)
app.command("reject")(approvals.reject)
app.command("check")(integrity.check_journals)
app.command("reanchor")(integrity.reanchor_run)
app.command("keygen")(integrity.make_journal_key)
app.command("demo")(proofs.demo)
app.command("verify")(proofs.verify_recovery)
app.command("export")(transfer.export_run)
app.command("import")(transfer.import_run)
app.command("replay")(versions.replay_runs)
app.command("migrate")(versions.migrate_ledger)
app.command("worker")(workers.run_worker)
app.command("ui")(console.ui)

approvers_app = typer.Typer(
    help="The approvers registry: who may sign approvals and review decisions.",
    no_args_is_help=True,
)
approvers_app.command("keygen")(approvals.make_approver_key)
approvers_app.command("add")(approvals.add_approver)
approvers_app.command("list")(approvals.list_approvers)
app.add_typer(approvers_app, name="approvers")

operator_app = typer.Typer(
    help="Your operator identity: the key review decisions are signed with.",
    no_args_is_help=True,
)
operator_app.command("init")(approvals.init_operator)
app.add_typer(operator_app, name="operator")

review_app = typer.Typer(
    help="Review cases of runs in needs_review, decided in one command: "
    "review decide CASE --redo | --keep | --abort.",
    no_args_is_help=True,
)
review_app.command("list")(review.list_review_cases)
review_app.command("show")(review.show_review_case)
review_app.command("decide")(review.decide_review_case)
app.add_typer(review_app, name="review")
