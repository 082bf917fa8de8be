"""`crashproof check`, `reanchor` and `keygen`: keeping the journal trustworthy."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.render import console, emit_json
from crashproof.cli.settings import (
    DbOption,
    JsonOption,
    VerboseOption,
    command_settings,
    open_ledger,
)
from crashproof.integrity.keys import KEY_BYTES, create_key_file, default_key_file, key_id

__all__ = ["check_journals", "make_journal_key", "reanchor_run"]


def check_journals(
    ctx: typer.Context,
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[RUN_ID]", show_default=False, help="The run to check (default: all)."
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Verify every journal record: its HMAC, the chain, the order, and the generation
    witness, then each model request kept beside a record against the digest the record
    holds (like git fsck; read-only), for every run of the journal and every run the
    witness saw (one the journal lost is a problem). Exit 0 when every run is sound, 5
    otherwise."""
    settings = command_settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        report = ledger.check(run_id)
    bad = [(rid, problem) for rid, problem in report if problem is not None]
    if settings.json:
        emit_json([{"run_id": rid, "ok": p is None, "problem": p} for rid, p in report])
    else:
        out = console()
        for rid, problem in report:
            if problem is None:
                out.print(Text(f"ok        {rid}"))
            else:
                out.print(Text(f"CORRUPT   {rid}: {problem}", style="red"))
        out.print(Text(f"{len(report)} run(s) checked, {len(bad)} with problems"))
    return int(ExitCode.LEDGER_UNUSABLE) if bad else int(ExitCode.OK)


def reanchor_run(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to re-anchor.")
    ],
    by: Annotated[
        str,
        typer.Option("--by", metavar="NAME", show_default=False, help="Who takes responsibility."),
    ],
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Trust a run's journal as it is now: set its generation witness to match (after a
    lost witness, or a journal restored on purpose). Logged with --by."""
    settings = command_settings(ctx, db, False, verbose)
    with open_ledger(settings, create=False) as ledger:
        generation = ledger.reanchor(run_id, by=by)
    sys.stderr.write(f"run {run_id!r} re-anchored at generation {generation} by {by}\n")
    return int(ExitCode.OK)


def make_journal_key(
    ctx: typer.Context,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            metavar="PATH",
            show_default=False,
            help="Write the key to this new file (mode 0600) instead of printing it.",
        ),
    ] = None,
    default: Annotated[
        bool,
        typer.Option(
            "--default",
            help="Write it to the default key file (~/.config/crashproof/key, mode 0600), "
            "which every ledger opened without CRASHPROOF_KEY or CRASHPROOF_KEY_FILE uses.",
        ),
    ] = False,
    verbose: VerboseOption = False,
) -> int:
    """Make a new random journal key (64 hex digits) for CRASHPROOF_KEY or a key file."""
    command_settings(ctx, None, False, verbose)
    if default:
        if file is not None:
            raise CliError(ExitCode.USAGE, "--file and --default name two places", "give one")
        return _default_key()
    key = secrets.token_hex(KEY_BYTES)
    if file is None:
        sys.stdout.write(key + "\n")
        return int(ExitCode.OK)
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CliError(
            ExitCode.USAGE,
            f"{file} already exists",
            "choose a new path; keys are never overwritten",
        ) from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key + "\n")
    sys.stderr.write(f"key {key_id(bytes.fromhex(key))} written to {file} (mode 0600)\n")
    return int(ExitCode.OK)


def _default_key() -> int:
    path = default_key_file()
    try:
        key = create_key_file(path)
    except FileExistsError:
        raise CliError(
            ExitCode.USAGE,
            f"{path} already exists",
            "ledgers opened without CRASHPROOF_KEY use it already; keys are never overwritten",
        ) from None
    except OSError as exc:
        raise CliError(
            ExitCode.USAGE,
            f"cannot write {path}: {exc.strerror or exc}",
            "set CRASHPROOF_KEY_FILE to a key file elsewhere (crashproof keygen --file PATH)",
        ) from None
    sys.stderr.write(
        f"key {key_id(key)} written to {path} (mode 0600); every ledger opened without "
        "CRASHPROOF_KEY or CRASHPROOF_KEY_FILE uses it. Back it up: without it existing "
        "ledgers cannot be verified\n"
    )
    return int(ExitCode.OK)
