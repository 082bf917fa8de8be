"""`crashproof review list | show | decide`: the cases of runs frozen in needs_review, and
the one command that decides one.

``review decide CASE --redo | --keep | --abort`` signs with the operator's identity
(``crashproof.cli.identity``: made and registered on first use where the ledger allows
it), and with ``--app MODULE`` resumes the run at once, so it finishes in the same
command. What each decision does:

- ``--redo`` (``replan``): the old operation id is quarantined for good and the act
  runs again under a new epoch (``run/step@2``). For a tool that cannot look its
  outcome up, the decision states that nothing can be re-read (``no_reread``).
- ``--keep``: nothing is sent again; the act is recorded as not done (the workflow
  gets ``cp.ActNotDone``) and the run goes on. Only where the target showed no
  receipt.
- ``--abort``: the run fails, every record kept as evidence.

Bad input changes nothing: a case that does not exist exits 2, a decision the case
does not accept (or a case no longer open) exits 4, before any key is made or used.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from crashproof.cli.commands.approvals import ByOption
from crashproof.cli.commands.runs import drive_and_report, resume_through_shell
from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.identity import trusted_operator
from crashproof.cli.loading import app_policies, app_workflows
from crashproof.cli.render import console, emit_json, safe
from crashproof.cli.settings import (
    DbOption,
    JsonOption,
    VerboseOption,
    command_settings,
    open_ledger,
)
from crashproof.runtime.guards.review import ReviewCase
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.operations.redaction import Redaction

__all__ = ["decide_review_case", "list_review_cases", "show_review_case"]

# The one-command names beside the signed statement's (replan stays what is signed).
_FLAGS = {"redo": "replan", "keep": "keep", "abort": "abort"}
_SHOWN = {"replan": "--redo", "keep": "--keep", "abort": "--abort", "continue": "continue"}


def list_review_cases(
    ctx: typer.Context,
    run_id: Annotated[
        str | None,
        typer.Argument(metavar="[RUN_ID]", show_default=False, help="Only this run's cases."),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="STATE",
            show_default=False,
            help="Only cases in this state: open, decided, resolved, superseded.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """List review cases (every needs_review freeze), oldest first, with the decisions
    each accepts."""
    settings = command_settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        cases = _redacted(ledger, ledger.review_cases(run_id, state=state))
    if settings.json:
        emit_json([case.to_json() for case in cases])
        return int(ExitCode.OK)
    table = Table("case", "state", "step", "decide with", "reason")
    for case in cases:
        table.add_row(
            safe(case.case_id),
            case.state,
            safe(case.key or "-"),
            " | ".join(_SHOWN[d] for d in case.decisions) if case.state == "open" else "-",
            safe(case.reason),
        )
    console().print(table)
    return int(ExitCode.OK)


def show_review_case(
    ctx: typer.Context,
    case_id: Annotated[str, typer.Argument(metavar="CASE", help="The case id (RUN_ID#SEQ).")],
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Show one review case with all its evidence (JSON): pending intent, digests, the
    receipt and its fingerprint, generation, the step's trace, the case fingerprint."""
    settings = command_settings(ctx, db, True, verbose)
    with open_ledger(settings, create=False) as ledger:
        (case,) = _redacted(ledger, [ledger.review_case(case_id)])
    emit_json(case.to_json())
    return int(ExitCode.OK)


def decide_review_case(
    ctx: typer.Context,
    case_id: Annotated[str, typer.Argument(metavar="CASE", help="The case id (RUN_ID#SEQ).")],
    decision: Annotated[
        str | None,
        typer.Argument(
            metavar="[replan|keep|abort|continue]",
            show_default=False,
            help="The decision as signed (or use --redo / --keep / --abort); continue lifts "
            "a run imported from a copy.",
        ),
    ] = None,
    redo: Annotated[
        bool, typer.Option("--redo", help="Send the act again under a new operation id.")
    ] = False,
    keep: Annotated[
        bool,
        typer.Option("--keep", help="Send nothing again: record the act as not done, go on."),
    ] = False,
    abort: Annotated[bool, typer.Option("--abort", help="Fail the run, keep the evidence.")] = (
        False
    ),
    app_modules: Annotated[
        list[str] | None,
        typer.Option(
            "--app",
            metavar="MODULE",
            show_default=False,
            help="Module defining the run's workflow: the run is resumed at once and "
            "finishes in this command. Repeatable.",
        ),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            "--key",
            metavar="PEM",
            show_default=False,
            help="Sign with this registered Ed25519 key instead of your operator identity.",
        ),
    ] = None,
    by: ByOption = None,
    no_reread: Annotated[
        bool,
        typer.Option(
            "--no-reread",
            help="State that the act's receipt cannot be re-read (set by itself for a redo "
            "of a tool without lookup).",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Decide a review case in one command, signed with your operator identity (made and
    registered on first use where the ledger has no approvers yet; see `crashproof
    operator init`). --redo: the act runs again under a new epoch; --keep: nothing is
    sent again, the act is recorded as not done and the run goes on; --abort: the run
    fails, evidence kept. With --app the run resumes at once and finishes here; without,
    a worker finishes it, or `crashproof resume RUN_ID --app MODULE`."""
    settings = command_settings(ctx, db, as_json, verbose)
    chosen = _chosen(decision, redo=redo, keep=keep, abort=abort)
    workflows = app_workflows(app_modules) if app_modules else []
    policies = app_policies(app_modules) if app_modules else []
    with open_ledger(settings, create=False) as ledger:
        case = ledger.review_case(case_id)  # none: exit 2, nothing changed
        _fits(case, chosen)
        signer = key if key is not None else trusted_operator(ledger, by).key
        stated = no_reread or (chosen == "replan" and case.no_lookup)
        ledger.decide(case_id, chosen, key=signer, by=by, no_reread=stated)
        status = ledger.get_run(case.run_id).status.value
        sys.stderr.write(
            safe(f"{_SHOWN[chosen].lstrip('-')} signed for case {case_id}; the run is now {status}")
            + "\n"
        )
        if settings.json and (not workflows or status != "running"):  # else: the run's outcome
            emit_json({"case_id": case_id, "decision": chosen, "status": status})
        if status != "running":
            return int(ExitCode.OK)
        if not workflows:
            sys.stderr.write(
                safe(
                    "a worker finishes it, or: crashproof resume "
                    f"{case.run_id} --app MODULE (or decide with --app MODULE)"
                )
                + "\n"
            )
            return int(ExitCode.OK)
        for workflow in workflows:
            ledger.register(workflow)
        for policy in policies:
            ledger.register_policy(policy)
        return drive_and_report(
            ledger, settings, case.run_id, lambda: resume_through_shell(ledger, case.run_id)
        )


def _redacted(ledger: Ledger, cases: Sequence[ReviewCase]) -> list[ReviewCase]:
    """The cases as a person may see them: what each run's policy marks secret hidden."""
    rules: dict[str, Redaction] = {}
    for case in cases:
        if case.run_id not in rules:
            rules[case.run_id] = Redaction.of(ledger.journal(case.run_id))
    return [rules[case.run_id].case(case) for case in cases]


def _chosen(decision: str | None, *, redo: bool, keep: bool, abort: bool) -> str:
    named = [flag for flag, on in (("redo", redo), ("keep", keep), ("abort", abort)) if on]
    if decision is not None:
        named.append(decision)
    if len(named) != 1:
        raise CliError(
            ExitCode.USAGE,
            "give exactly one decision" + (f" (got {', '.join(named)})" if named else ""),
            "crashproof review decide CASE --redo | --keep | --abort; nothing was signed",
        )
    word = named[0]
    chosen = _FLAGS.get(word, word)
    if chosen not in _SHOWN:
        raise CliError(
            ExitCode.USAGE,
            f"unknown decision {word!r}",
            "use --redo, --keep or --abort (or replan, keep, abort, continue); nothing was signed",
        )
    return chosen


def _fits(case: ReviewCase, chosen: str) -> None:
    """Refuse, before any key is made or used, a decision this case cannot take."""
    if case.state != "open":
        raise CliError(
            ExitCode.CONFLICT,
            f"case {case.case_id} is {case.state}, not open; nothing was signed",
            f"crashproof review list {case.run_id} shows the run's open case, if any",
        )
    if chosen not in case.decisions:
        why = {
            "keep": ": its target holds a receipt that is not provably this act's",
            "replan": ": replan needs a case raised by an act in flight",
            "continue": ": continue lifts only a run imported from a copy",
        }.get(chosen, "")
        raise CliError(
            ExitCode.CONFLICT,
            f"case {case.case_id} accepts {' or '.join(_SHOWN[d] for d in case.decisions)}, "
            f"not {_SHOWN[chosen]}{why}; nothing was signed",
            f"crashproof review show {case.case_id} shows its evidence",
        )
