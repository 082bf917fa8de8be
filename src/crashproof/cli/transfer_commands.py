"""`crashproof export` and `import`: a run as one signed checkpoint document."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from crashproof.cli.app import DbOption, VerboseOption, _settings, app
from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.settings import open_ledger
from crashproof.integrity import checkpoint


@app.command("export")
def export_command(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to export.")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="FILE",
            show_default=False,
            help="Write the checkpoint to this new file instead of standard output.",
        ),
    ] = None,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Export a run as one signed checkpoint (canonical JSON): its journal records with
    their MACs, verified first. Import it elsewhere with `crashproof import`."""
    settings = _settings(ctx, db, False, verbose)
    with open_ledger(settings, create=False) as ledger:
        document = ledger.export_run(run_id)
    data = checkpoint.serialize(document) + b"\n"
    if out is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return int(ExitCode.OK)
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CliError(
            ExitCode.USAGE, f"{out} already exists", "choose a new path; nothing was written"
        ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    sys.stderr.write(
        f"run {run_id!r} exported to {out} (generation {document['run']['generation']})\n"
    )
    return int(ExitCode.OK)


@app.command("import")
def import_command(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Argument(metavar="FILE", show_default=False, help="The checkpoint to import."),
    ],
    by: Annotated[
        str,
        typer.Option("--by", metavar="NAME", show_default=False, help="Who takes responsibility."),
    ],
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Verify a checkpoint (signature, schema, fields, every record's MAC, generation)
    and install its run in the ledger. Any mismatch: nothing is written. Logged with --by."""
    settings = _settings(ctx, db, False, verbose)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise CliError(
            ExitCode.USAGE, f"cannot read {file}: {exc.strerror}", "check the path"
        ) from None
    document = checkpoint.parse(data)
    with open_ledger(settings, create=True) as ledger:
        run_id = ledger.import_run(document, by=by)
    sys.stderr.write(
        f"run {run_id!r} imported at generation {document['run']['generation']} by {by}\n"
    )
    return int(ExitCode.OK)
