"""`crashproof replay`, `migrate`, and `runs --version`: changing code and schemas under
live runs, explicitly."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.loading import app_workflows
from crashproof.cli.render import console, emit_json
from crashproof.cli.settings import (
    JsonOption,
    Settings,
    VerboseOption,
    command_settings,
    open_ledger,
    sqlite_path,
)
from crashproof.errors import LedgerError
from crashproof.integrity.keys import resolve_keyring
from crashproof.integrity.seal import Sealer
from crashproof.integrity.witness import SQLiteWitness
from crashproof.journal.records import RunInfo
from crashproof.runtime.replayer.sources import replay_check
from crashproof.runtime.replayer.verdict import apply_mappings
from crashproof.store.migrate import apply_plan, open_for_migration, plan_migration

__all__ = ["migrate_ledger", "print_versions", "replay_runs", "versions_in_flight"]


def replay_runs(
    ctx: typer.Context,
    modules: Annotated[
        list[str],
        typer.Argument(
            metavar="MODULE...",
            show_default=False,
            help="Module(s) defining the workflows as the code now stands (every crashproof "
            "workflow in their globals), imported from the current directory first.",
        ),
    ],
    source: Annotated[
        str,
        typer.Option(
            "--from",
            metavar="LEDGER_OR_EXPORT",
            show_default=False,
            help="A ledger (path, sqlite:///..., postgresql://...) or a checkpoint exported "
            "with `crashproof export`.",
        ),
    ],
    run_ids: Annotated[
        list[str] | None,
        typer.Option("--run", metavar="RUN_ID", show_default=False, help="Only this run."),
    ] = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Replay recorded runs against the current code without executing anything.

    Every ctx call is matched with the journal (step key, kind, arguments digest, act
    intent digest incl. the tool's contract version); no step, model or tool runs, and the
    source is never written (a SQLite ledger is read through a snapshot copy). Runs in
    flight replay up to their end of journal. Prints per run `compatible` or
    `non-deterministic at step K (recorded X, code now Y)`; exit 0 when every run is
    compatible, 4 when any is not. Run it in CI before deploying workflow code.
    """
    settings = command_settings(ctx, None, as_json, verbose)
    workflows = app_workflows(modules)
    verdicts = replay_check(workflows, source, run_ids=run_ids or None)
    if settings.json:
        emit_json([v.to_json() for v in verdicts])
    else:
        out = console()
        for v in verdicts:
            style = "green" if v.ok else "bold red"
            out.print(Text(f"{v.run_id} ({v.workflow}@{v.version}): ") + Text(v.detail, style))
        bad = sum(not v.ok for v in verdicts)
        out.print(Text(f"{len(verdicts)} run(s) replayed, {bad} incompatible", style="dim"))
    return int(ExitCode.CONFLICT if any(not v.ok for v in verdicts) else ExitCode.OK)


AppOption = Annotated[
    list[str] | None,
    typer.Option(
        "--app",
        metavar="MODULE",
        show_default=False,
        help="Module(s) defining the workflows as the code now stands: also preview (and "
        "apply) the tool contract mappings their tools declare, per run.",
    ),
]


def migrate_ledger(
    ctx: typer.Context,
    preview: Annotated[
        bool,
        typer.Option("--preview", help="List every change without writing anything."),
    ] = False,
    db: Annotated[
        str | None,
        typer.Option("--db", metavar="URL", show_default=False, help="The ledger to migrate."),
    ] = None,
    app: AppOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Migrate a ledger (SQLite or PostgreSQL) to this crashproof's schema, after previewing.

    --preview lists every change: each pending migration, new columns and the value
    existing rows get, value maps, journal records to seal, and anything that cannot be
    mapped (unresolved). Without --preview the plan is applied in one transaction and
    recorded, only when nothing is unresolved. With --app MODULE, the runs whose recorded
    acts ran under an older tool contract that the tool's declared mapping explains get
    a compatibility verdict: previewed, then journaled (and the freeze it resolves
    lifted) when the replay check passes. Exit 0 when the ledger is (or can be made)
    current, 4 when something is unresolved (nothing is written).
    """
    settings = command_settings(ctx, db, as_json, verbose)
    if settings.db.startswith(("postgresql://", "postgres://")):
        code, data, lines, current = _migrate_postgres(settings.db, preview, settings.json)
    else:
        code, data, lines, current = _migrate_sqlite(settings.db, preview, settings.json)
    if app:
        if current:
            code = max(code, _contracts(settings, app, preview, data, lines))
        else:
            lines.append("tool contract mappings: previewed once the schema is current")
    _print_plan(settings.json, data, lines)
    return code


Outcome = tuple[int, dict[str, Any], list[str], bool]  # code, JSON, lines, schema current


def _migrate_sqlite(url: str, preview: bool, as_json: bool) -> Outcome:
    path = sqlite_path(url)
    if path is None:
        raise CliError(
            ExitCode.USAGE,
            f"crashproof migrate works on SQLite and PostgreSQL ledgers, not "
            f"{url.split(':', 1)[0]!r}",
            "pass --db sqlite:///path.db or --db postgresql://...",
        )
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        try:
            plan = plan_migration(conn, current, str(path))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read ledger {path} ({exc}); nothing was changed") from None
        if preview or plan.unresolved or not plan.pending:
            if plan.unresolved:
                if not preview:
                    _print_plan(as_json, plan.to_json(), plan.lines())
                    raise CliError(
                        ExitCode.CONFLICT,
                        f"{len(plan.unresolved)} unresolved item(s) block the migration of "
                        f"{path}; nothing was changed",
                        "map the values in a migration (-- map: TABLE.COLUMN OLD -> NEW) or "
                        "repair the records, then preview again",
                    )
                return int(ExitCode.CONFLICT), plan.to_json(), plan.lines(), False
            return int(ExitCode.OK), plan.to_json(), plan.lines(), not plan.pending
        sealer = Sealer(resolve_keyring(None)) if plan.unsealed else None
        sealed = apply_plan(conn, plan, sealer)
    _anchor(path, sealed)
    result = plan.to_json() | {"applied": True, "sealed_runs": [r for r, _ in sealed]}
    return (
        int(ExitCode.OK),
        result,
        [*plan.lines(), f"migrated {path} to schema {plan.target}"],
        True,
    )


def _migrate_postgres(url: str, preview: bool, as_json: bool) -> Outcome:
    try:
        from crashproof.store.migrate_postgres import apply_postgres, plan_postgres
    except ImportError as exc:
        raise CliError(
            ExitCode.USAGE,
            f"PostgreSQL ledgers need psycopg ({exc})",
            "install them with: pip install 'crashproof[postgres]'",
        ) from None
    try:
        plan = plan_postgres(url)
    except ValueError as exc:
        raise CliError(ExitCode.USAGE, f"bad ledger URL: {exc}", "see crashproof --help") from None
    if preview or plan.unresolved or not plan.pending:
        if plan.unresolved:
            if not preview:
                _print_plan(as_json, plan.to_json(), plan.lines())
                raise CliError(
                    ExitCode.CONFLICT,
                    f"{len(plan.unresolved)} unresolved item(s) block the migration; nothing "
                    "was changed",
                    "map the values in a migration (-- map: TABLE.COLUMN OLD -> NEW) or "
                    "repair the records, then preview again",
                )
            return int(ExitCode.CONFLICT), plan.to_json(), plan.lines(), False
        return int(ExitCode.OK), plan.to_json(), plan.lines(), not plan.pending
    apply_postgres(url, plan)
    return (
        int(ExitCode.OK),
        plan.to_json() | {"applied": True},
        [*plan.lines(), f"migrated {plan.where} to schema {plan.target}"],
        True,
    )


def _contracts(
    settings: Settings, modules: list[str], preview: bool, data: dict[str, Any], lines: list[str]
) -> int:
    """Preview (or apply) the declared tool contract mappings of every run in flight;
    adds them to ``data`` and ``lines``; 4 when a run's verdict needs a review."""
    workflows = {wf.name: wf for wf in app_workflows(modules)}
    with contextlib.closing(open_ledger(settings, create=False)) as ledger:
        for wf in workflows.values():
            ledger.register(wf)
        found = apply_mappings(ledger, workflows, preview=preview)
    data["contracts"] = found
    if not found:
        lines.append(
            "tool contract mappings: no run in flight has an act to map or a verdict to revisit"
        )
    for entry in found:
        verdict = entry["verdict"]
        acts = ", ".join(
            f"{m['key']!r} ({m['tool']} {m['from_version']} -> {m['to_version']})"
            for m in verdict["mapped"]
        )
        what = f"map act(s) {acts}" if acts else "its verdict judged again under this code"
        done = "applied" if entry["applied"] else "would be applied"
        if verdict["decision"] != "resumable":
            done = f"UNRESOLVED: {verdict['unresolved'][0]}"
        thawed = "; its freeze lifted" if entry["thawed"] and entry["applied"] else ""
        lines.append(f"  run {entry['run_id']}: {what}: {done}{thawed}")
    review = any(e["verdict"]["decision"] != "resumable" for e in found)
    return int(ExitCode.CONFLICT if review else ExitCode.OK)


def _anchor(path: Path, sealed: Sequence[tuple[str, int]]) -> None:
    """Runs sealed by the migration had no witness entry (they predate the seal): anchor
    them at their generation, as the migration vouched for them."""
    if not sealed:
        return
    witness = SQLiteWitness(path.with_name(path.name + ".witness"))
    try:
        for run_id, generation in sealed:
            if witness.get(run_id) is None:
                witness.reset(run_id, generation)
                sys.stderr.write(
                    f"run {run_id!r}: sealed by the migration, witness anchored at "
                    f"generation {generation}\n"
                )
    finally:
        witness.close()


def _print_plan(as_json: bool, data: dict[str, Any], lines: list[str]) -> None:
    if as_json:
        emit_json(data)
        return
    out = console()
    for line in lines:  # one line each, never broken at the console's width (paths)
        style = "bold red" if "UNRESOLVED" in line else None
        out.print(Text(line, style=style or ""), soft_wrap=True)


def versions_in_flight(infos: Sequence[RunInfo]) -> list[dict[str, Any]]:
    """Runs not yet ended, grouped per workflow name and version (oldest group first)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for info in infos:
        if info.status.terminal:
            continue
        group = groups.setdefault(
            (info.workflow, info.version),
            {
                "workflow": info.workflow,
                "version": info.version,
                "runs": 0,
                "by_status": {},
                "oldest": info.created_at,
                "run_ids": [],
            },
        )
        group["runs"] += 1
        group["by_status"][info.status.value] = group["by_status"].get(info.status.value, 0) + 1
        group["oldest"] = min(group["oldest"], info.created_at)
        group["run_ids"].append(info.run_id)
    return sorted(groups.values(), key=lambda g: (g["workflow"], g["oldest"]))


def print_versions(as_json: bool, infos: Sequence[RunInfo]) -> None:
    """``crashproof runs --version``: what is in flight per workflow version, so an
    operator knows when an old version can be retired (no runs left on it)."""
    groups = versions_in_flight(infos)
    if as_json:
        emit_json(groups)
        return
    out = console()
    if not groups:
        out.print(Text("no runs in flight: every workflow version can be retired", style="dim"))
        return
    table = Table(title="runs in flight per workflow version", title_justify="left")
    for name in ("workflow", "version", "runs", "statuses", "oldest run"):
        table.add_column(name)
    for g in groups:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(g["by_status"].items()))
        table.add_row(g["workflow"], g["version"], str(g["runs"]), statuses, g["run_ids"][0])
    out.print(table)
    sys.stdout.flush()
