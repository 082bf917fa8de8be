"""`crashproof approvers`, `approve`, `reject` and `operator init`: who may sign, and
approvals and rejections.

``crashproof.cli.app`` registers ``approve`` and ``reject`` at the top level, the others under the
``approvers`` and ``operator`` groups. Review cases and decisions: ``review.py``.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.identity import trusted_operator
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
    "ByOption",
    "add_approver",
    "approve",
    "init_operator",
    "list_approvers",
    "make_approver_key",
    "parse_ttl",
    "reject",
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
    key: Annotated[
        Path | None,
        typer.Option(
            "--key",
            metavar="PEM",
            show_default=False,
            help="Sign with this registered Ed25519 key instead of your operator identity.",
        ),
    ] = None,
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
    `crashproof resume RUN_ID --app MODULE` then executes exactly that act, once.
    Signed with your operator identity (`crashproof operator init`) unless --key is
    given, as `reject` and `review decide` sign."""
    settings = command_settings(ctx, db, as_json, verbose)
    seconds = parse_ttl(ttl)
    with open_ledger(settings, create=False) as ledger:
        ledger.pending_act(run_id, step)  # refused before any key is made or used
        signer = key if key is not None else trusted_operator(ledger, by).key
        document = ledger.approve(run_id, step, key=signer, ttl=seconds, by=by)
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


def reject(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run awaiting approval.")],
    step: Annotated[
        str | None,
        typer.Argument(metavar="[STEP]", show_default=False, help="The pending act's step key."),
    ] = None,
    reason: Annotated[
        str,
        typer.Option(
            "--reason", metavar="TEXT", show_default=False, help="Why (journaled, signed)."
        ),
    ] = "",
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
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Sign a rejection of the act a run waits on, with a reason, and journal it. The
    run goes on (a worker, or `crashproof resume RUN_ID --app MODULE`): the workflow
    gets cp.ApprovalRefused at that act, which never executes. Signed with your
    operator identity (`crashproof operator init`) unless --key is given. No such run:
    exit 2; not awaiting approval, or decided already: exit 4; nothing changed."""
    settings = command_settings(ctx, db, as_json, verbose)
    if not reason.strip():
        raise CliError(
            ExitCode.USAGE,
            "a rejection needs a reason; nothing was signed",
            f"crashproof reject {shlex.quote(run_id)} --reason 'why not'",
        )
    with open_ledger(settings, create=False) as ledger:
        ledger.pending_act(run_id, step)  # refused before any key is made or used
        signer = key if key is not None else trusted_operator(ledger, by).key
        document = ledger.reject(run_id, step, key=signer, reason=reason, by=by)
    statement = document["statement"]
    if settings.json:
        emit_json(document)
    else:
        sys.stderr.write(
            safe(
                f"rejected {statement['operation_id']} as {statement['approver']}: "
                f"{statement['reason']}; the run goes on and gets cp.ApprovalRefused there "
                "(a worker drives it, or crashproof resume "
                f"{shlex.quote(run_id)} --app MODULE)"
            )
            + "\n"
        )
    return int(ExitCode.OK)


def init_operator(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="NAME",
            show_default=False,
            help="The approver name to register under (default: user@host).",
        ),
    ] = None,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Set up your operator identity once: an Ed25519 key under your config directory
    (mode 0600; $CRASHPROOF_OPERATOR_KEY to put it elsewhere), registered as the
    ledger's first approver when it has none. A ledger that has approvers already is
    restricted: one of them admits your key with `crashproof approvers add`. Safe to
    run again; `crashproof review decide` does the same on first use."""
    settings = command_settings(ctx, db, False, verbose)
    with open_ledger(settings, create=True) as ledger:
        who = trusted_operator(ledger, name)
    sys.stderr.write(
        safe(f"operator {who.name!r}, key {who.fingerprint[:16]}… at {who.path}") + "\n"
    )
    return int(ExitCode.OK)
