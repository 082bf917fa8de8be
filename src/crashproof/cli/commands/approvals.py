"""`crashproof approvers`, `approve` and `review`: humans in the loop, with signatures.

``crashproof.cli.app`` registers ``approve`` at the top level, the others under the
``approvers`` and ``review`` groups.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.render import console, emit_json, safe
from crashproof.cli.settings import (
    DbOption,
    JsonOption,
    VerboseOption,
    command_settings,
    open_ledger,
)
from crashproof.integrity.signing import generate_keypair
from crashproof.runtime.guards.approvals import MAX_TTL

__all__ = [
    "add_approver",
    "approve",
    "decide_review_case",
    "list_approvers",
    "list_review_cases",
    "make_approver_key",
    "parse_ttl",
    "show_review_case",
]

KeyOption = Annotated[
    Path,
    typer.Option(
        "--key",
        metavar="PEM",
        show_default=False,
        help="Your Ed25519 private key (PEM), registered with `crashproof approvers add`.",
    ),
]
ByOption = Annotated[
    str | None,
    typer.Option(
        "--by", metavar="NAME", show_default=False, help="Who submits it (default: OS user)."
    ),
]

_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_ttl(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` → seconds."""
    match = _TTL.match(text)
    seconds = float(match.group(1)) * _UNITS[match.group(2)] if match is not None else 0.0
    if not 0 < seconds <= MAX_TTL:
        raise CliError(
            ExitCode.USAGE,
            f"--ttl {text!r} is not a duration from 1s to {MAX_TTL / 86400:.0f}d",
            "use a positive number with an optional unit: 90s, 15m, 2h, 1d (an approval "
            "is for an act now, at most 30 days); nothing was signed",
        )
    return seconds


def make_approver_key(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Argument(metavar="FILE", show_default=False, help="The new private key file."),
    ],
    verbose: VerboseOption = False,
) -> int:
    """Make an Ed25519 key pair: FILE (private, mode 0600) and FILE.pub (public, to
    register with `crashproof approvers add`). Existing files are never overwritten."""
    command_settings(ctx, None, False, verbose)
    try:
        fingerprint = generate_keypair(file)
    except FileExistsError as exc:
        raise CliError(ExitCode.USAGE, str(exc), "choose a new path") from None
    sys.stderr.write(f"key {fingerprint[:16]}… written to {file} and {file}.pub\n")
    return int(ExitCode.OK)


def add_approver(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The approver's name.")],
    public_key: Annotated[
        Path, typer.Argument(metavar="PUBKEY_FILE", help="Their Ed25519 public key (PEM).")
    ],
    by: ByOption = None,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Register an approver (journaled, attributable; one key per name, for good)."""
    settings = command_settings(ctx, db, False, verbose)
    try:
        pem = public_key.read_text()
    except OSError as exc:
        raise CliError(
            ExitCode.USAGE, f"cannot read {public_key}: {exc}", "check the path"
        ) from None
    with open_ledger(settings, create=True) as ledger:
        approver = ledger.add_approver(name, pem, by=by)
    sys.stderr.write(f"approver {approver.name!r} registered, key {approver.fingerprint[:16]}…\n")
    return int(ExitCode.OK)


def list_approvers(
    ctx: typer.Context,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """List the registered approvers: name, key fingerprint, who added them and when."""
    settings = command_settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        approvers = sorted(ledger.approvers().values(), key=lambda a: a.name)
    if settings.json:
        emit_json([a.to_json() for a in approvers])
        return int(ExitCode.OK)
    table = Table("name", "key fingerprint", "added by", "host")
    for a in approvers:
        table.add_row(a.name, a.fingerprint, a.added_by, a.host)
    console().print(table)
    return int(ExitCode.OK)


def approve(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run awaiting approval.")],
    step: Annotated[
        str | None,
        typer.Argument(metavar="[STEP]", show_default=False, help="The pending act's step key."),
    ] = None,
    key: KeyOption = Path("approver.pem"),
    ttl: Annotated[
        str, typer.Option("--ttl", metavar="DURATION", help="How long it stays valid (15m, 2h).")
    ] = "15m",
    by: ByOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Sign an approval of the act a run waits on, and journal it. It binds the run, step,
    operation id, intent digest, generation, policy, an expiry and a one-time nonce;
    `crashproof resume RUN_ID --app MODULE` then executes exactly that act, once."""
    settings = command_settings(ctx, db, as_json, verbose)
    seconds = parse_ttl(ttl)
    with open_ledger(settings, create=False) as ledger:
        document = ledger.approve(run_id, step, key=key, ttl=seconds, by=by)
    statement = document["statement"]
    if settings.json:
        emit_json(document)
    else:
        sys.stderr.write(
            safe(
                f"approved {statement['operation_id']} (intent "
                f"{statement['intent_digest'][:12]}…) as {statement['approver']}, valid {ttl}; "
                "resume the run to execute it"
            )
            + "\n"
        )
    return int(ExitCode.OK)


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
    """List review cases (every needs_review freeze), oldest first."""
    settings = command_settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        cases = ledger.review_cases(run_id, state=state)
    if settings.json:
        emit_json([case.to_json() for case in cases])
        return int(ExitCode.OK)
    table = Table("case", "state", "step", "fingerprint", "reason")
    for case in cases:
        table.add_row(case.case_id, case.state, case.key or "-", case.fingerprint[:16], case.reason)
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
        case = ledger.review_case(case_id)
    emit_json(case.to_json())
    return int(ExitCode.OK)


def decide_review_case(
    ctx: typer.Context,
    case_id: Annotated[str, typer.Argument(metavar="CASE", help="The case id (RUN_ID#SEQ).")],
    decision: Annotated[
        str,
        typer.Argument(
            metavar="replan|abort|continue",
            help="replan: new epoch; abort: fail it; continue: lift an imported copy.",
        ),
    ],
    key: KeyOption = Path("reviewer.pem"),
    by: ByOption = None,
    no_reread: Annotated[
        bool,
        typer.Option(
            "--no-reread",
            help="The act's tool cannot look its receipt up: decide on the case's evidence "
            "alone (a replan of such an act needs it).",
        ),
    ] = False,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Sign a decision on a review case (bound to its fingerprint and a nonce) and journal
    it. replan: the conflicting operation id is quarantined and the act runs under a new
    epoch on resume; abort: the run fails, evidence kept. The receipt is re-read before
    the decision is consumed: if it changed, the case stays open. continue (only for a run
    imported from a copy): you vouch that the source did not go on; the run resumes."""
    settings = command_settings(ctx, db, False, verbose)
    with open_ledger(settings, create=False) as ledger:
        ledger.decide(case_id, decision, key=key, by=by, no_reread=no_reread)
        status = ledger.get_run(case_id.rpartition("#")[0]).status.value
    sys.stderr.write(safe(f"{decision} signed for case {case_id}; the run is now {status}") + "\n")
    if status == "running":
        sys.stderr.write("resume it to apply the decision: crashproof resume RUN_ID --app MODULE\n")
    return int(ExitCode.OK)
