"""`crashproof export` and `import`: a run as one signed checkpoint document."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.render import safe
from crashproof.cli.settings import (
    DbOption,
    JsonOption,
    Settings,
    VerboseOption,
    command_settings,
    open_ledger,
    sqlite_path,
)
from crashproof.integrity import checkpoint
from crashproof.runtime.operations.transfer import ImportPlan

__all__ = ["export_run", "import_run", "render_plan"]


def export_run(
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
    copy: Annotated[
        bool,
        typer.Option(
            "--copy",
            help="Export a read-only copy and write nothing (backups, inspection, replay "
            "--from). Imported, a copy stays frozen until a signed decision.",
        ),
    ] = False,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            metavar="NAME",
            show_default=False,
            help="Who moves the run (default: the OS user); recorded in its journal.",
        ),
    ] = None,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Export a run as one signed checkpoint (canonical JSON): its journal records with
    their MACs, verified first. A move by default: the run's journal records that it left
    with this checkpoint, and this ledger refuses to run or resume it from then on; it
    continues where the checkpoint is imported (`crashproof import`). Exporting a moved
    run again writes the same checkpoint. --copy writes nothing."""
    settings = command_settings(ctx, db, False, verbose)
    # The file is made before the run is moved, so a path that cannot be written (it
    # exists, its directory is missing or read-only) changes nothing anywhere.
    fd = None if out is None else _create(out)
    try:
        with open_ledger(settings, create=False) as ledger:
            document = ledger.export_run(run_id, copy=copy, by=by)
    except BaseException:
        if fd is not None and out is not None:
            os.close(fd)
            out.unlink(missing_ok=True)
        raise
    data = checkpoint.serialize(document) + b"\n"
    digest = checkpoint.digest(document)
    generation = document["run"]["generation"]
    moved = document["records"][-1]["type"] == "run_moved"
    note = (
        f"run {run_id!r} moved out at generation {generation} (checkpoint {digest}): this "
        "ledger no longer runs it; import the checkpoint where it continues\n"
        if moved
        else f"run {run_id!r}: a copy at generation {generation} (checkpoint {digest}); "
        "nothing was written, and an import of it stays frozen until a signed decision\n"
    )
    if out is None or fd is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        sys.stderr.write(note)
        return int(ExitCode.OK)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:  # the disk filled up under the write
        out.unlink(missing_ok=True)
        raise CliError(
            ExitCode.USAGE,
            f"cannot write {out}: {exc.strerror or exc}; "
            + ("the run is moved out, and " if moved else "")
            + "no checkpoint was kept",
            "free space or choose another path: "
            f"`crashproof export {shlex.quote(run_id)} --out NEW` writes the same checkpoint",
        ) from None
    sys.stderr.write(f"exported to {out}: {note}")
    return int(ExitCode.OK)


def _create(out: Path) -> int:
    try:
        return os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CliError(
            ExitCode.USAGE,
            f"{out} already exists; nothing was exported",
            "choose a new path (exporting a moved run again writes the same checkpoint)",
        ) from None
    except OSError as exc:
        raise CliError(
            ExitCode.USAGE,
            f"cannot create {out}: {exc.strerror or exc}; nothing was exported",
            "choose a path in a directory that exists and that you can write",
        ) from None


def import_run(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Argument(metavar="FILE", show_default=False, help="The checkpoint to import."),
    ],
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            metavar="NAME",
            show_default=False,
            help="Who takes responsibility (required unless --preview).",
        ),
    ] = None,
    preview: Annotated[
        bool,
        typer.Option(
            "--preview",
            help="Verify the checkpoint and show what the import would do; write nothing.",
        ),
    ] = False,
    as_json: JsonOption = False,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Verify a checkpoint (signature, schema, fields, every record's MAC, generation,
    the run header against its records) and install its run in the ledger. An older
    format is migrated (1 -> 2: the derived header fields are folded from the records).
    Any mismatch: nothing is written. Logged with --by. --preview shows the run, its
    generation, the format migration and the derived fields, and writes nothing."""
    settings = command_settings(ctx, db, as_json, verbose)
    if not preview and not by:
        raise CliError(
            ExitCode.USAGE,
            "import needs --by NAME (who takes responsibility)",
            "add --by, or use --preview to see what the import would do; nothing was written",
        )
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise CliError(
            ExitCode.USAGE, f"cannot read {file}: {exc.strerror}", "check the path"
        ) from None
    document = checkpoint.parse(data)
    if preview:
        plan, missing = _preview(settings, document)
        if settings.json:
            shown = {**plan.to_json(), "ledger_exists": not missing}
            sys.stdout.write(json.dumps(shown, indent=2, sort_keys=True) + "\n")
        else:
            if missing is not None:
                sys.stdout.write(f"no ledger at {missing} yet: the import creates it\n")
            sys.stdout.write(safe(render_plan(plan)))  # a checkpoint is anyone's file
        return int(ExitCode.OK)
    with open_ledger(settings, create=True) as ledger:
        run_id = ledger.import_run(document, by=by or "")
        info = ledger.get_run(run_id)
    sys.stderr.write(
        f"run {run_id!r} imported at generation {document['run']['generation']} by {by}"
        + (
            f" (format {document['schema_version']} migrated to {checkpoint.SCHEMA_VERSION})"
            if document["schema_version"] != checkpoint.SCHEMA_VERSION
            else ""
        )
        + f": {info.status.value}\n"
    )
    if info.reason and "imported from a copy" in info.reason:
        sys.stderr.write(
            f"frozen: {safe(info.reason)}\n"
            f"  see `crashproof review list {shlex.quote(run_id)}`, then "
            "`crashproof review decide CASE continue --key KEY.pem` or `... abort`\n"
        )
    return int(ExitCode.OK)


def _preview(settings: Settings, document: dict[str, Any]) -> tuple[ImportPlan, Path | None]:
    """The plan against the ledger, or against an empty scratch ledger (same key) when
    the SQLite file does not exist yet: a preview never creates the target."""
    path = sqlite_path(settings.db)
    if path is None or path.exists():
        with open_ledger(settings, create=False) as ledger:
            return ledger.preview_import(document), None
    with tempfile.TemporaryDirectory(prefix="crashproof-preview-") as scratch:
        empty = replace(settings, db=f"sqlite:///{Path(scratch) / 'preview.db'}")
        with open_ledger(empty, create=True) as ledger:
            return ledger.preview_import(document), path


_ACTIONS = {
    "install": "install the run (a new run in this ledger)",
    "nothing": "nothing: this ledger already holds this journal (or its import)",
    "return": "bring the moved run back: this is the ledger it left, its journal ends "
    "with this very move",
    "repair-witness": "set the witness to the generation (the run is here, its witness "
    "missing or behind)",
}


def render_plan(plan: ImportPlan) -> str:
    """The preview of one import, for people."""
    lines = [
        f"checkpoint of run {plan.run_id!r}: workflow {plan.workflow!r} version "
        f"{plan.version!r}, status {plan.status}, generation {plan.generation} "
        f"({plan.records} record(s)), signed with key id {plan.key_id}",
        (
            f"format migration {plan.from_format} -> {plan.to_format}: the run header "
            "fields below are derived from the records"
            if plan.migrates
            else f"format {plan.from_format} (current): the run header fields below "
            "match the records"
        ),
    ]
    derived = plan.derived
    policy = derived["policy"]
    lines.append(
        "  policy: none"
        if policy is None
        else f"  policy: {policy['version']} (digest {str(policy['digest'])[:16]}, "
        f"identity {policy['identity']})"
    )
    limits = {k: v for k, v in (derived["limits"] or {}).items() if v is not None}
    lines.append(
        "  limits: " + (", ".join(f"{k} {v}" for k, v in limits.items()) if limits else "none")
    )
    used = derived["budget_used"]
    lines.append(
        f"  budget used: {used['steps']} step(s), {used['decisions']} decision(s), "
        f"{used['tokens']} token(s), cost {used['cost']:g}"
    )
    approvals = derived["approvals"]
    lines.append(f"  approvals: {approvals['granted']} granted, {approvals['consumed']} consumed")
    cases = derived["open_review_cases"]
    lines.append(f"  open review cases: {len(cases) or 'none'}")
    lines.extend(
        f"    {c['case_id']} ({c['state']}) fingerprint {c['fingerprint'][:16]}: {c['reason']}"
        for c in cases
    )
    lines.append(
        f"checkpoint {plan.checkpoint}: a move (the run's one continuation)"
        if plan.transfer == "move"
        else f"checkpoint {plan.checkpoint}: a copy (the source may have gone on)"
    )
    lines.append(f"would do: {_ACTIONS[plan.action]}")
    if plan.installs_as:
        lines.append(f"  the run would be {plan.installs_as} here")
    lines.append("preview only: nothing was written")
    return "\n".join(lines) + "\n"
