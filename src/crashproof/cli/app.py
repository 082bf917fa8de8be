"""The typer application: one function per command, each a thin shell over the Ledger.

Commands raise; ``crashproof.cli.main`` turns every error into one error line, one
hint line and an exit code (see ``crashproof.cli.exitcodes``).
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from crashproof.cli.exitcodes import EXIT_CODES_TEXT, CliError, ExitCode, failure_for
from crashproof.cli.loading import (
    app_tools,
    app_workflows,
    import_module,
    load_workflow,
    parse_args,
)
from crashproof.cli.render import (
    console,
    emit_json,
    print_checks,
    print_run,
    print_runs,
    run_summary,
)
from crashproof.cli.settings import DEFAULT_DB, ENV_DB, Settings, State, open_ledger, resolve
from crashproof.errors import CrashproofError
from crashproof.integrity.keys import KEY_BYTES, key_id
from crashproof.journal.records import Limits, RunStatus
from crashproof.runtime.budget import operator, parse_raises, raise_limits
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.policy import Policy

__all__ = ["app"]


def _epilog() -> str:
    # Rendered as Markdown by typer's rich help: a table keeps the codes aligned.
    rows = [f"| {int(code)} | {text} |" for code, text in EXIT_CODES_TEXT.items()]
    return "\n".join(["| exit code | meaning |", "|---:|:---|", *rows])


app = typer.Typer(
    name="crashproof",
    epilog=_epilog(),
    add_completion=False,
    rich_markup_mode="markdown",  # joins hard-wrapped docstring lines into paragraphs
    context_settings={"help_option_names": ["-h", "--help"]},
)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        show_default=False,
        help=(
            f"Ledger URL: sqlite:///relative.db, sqlite:////absolute.db or memory://. "
            f"Default: ${ENV_DB}, else {DEFAULT_DB}."
        ),
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables."),
]
VerboseOption = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="Log at INFO on stderr; show tracebacks of errors."),
]


def _settings(ctx: typer.Context, db: str | None, as_json: bool, verbose: bool) -> Settings:
    return resolve(ctx.ensure_object(State), db=db, as_json=as_json, verbose=verbose)


@app.callback()
def root(
    ctx: typer.Context,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Crash-proof runs of AI agents: start them, inspect them, resume them.

    --db, --json and --verbose work before or after the command
    (crashproof --db X runs, or crashproof runs --db X).
    """
    state = ctx.ensure_object(State)
    state.db, state.json, state.verbose = db, as_json, verbose


def _finish(ledger: Ledger, settings: Settings, run_id: str, go: Callable[[], Any]) -> int:
    """Drive a run with ``go`` and print its outcome; errors propagate to ``main``."""
    try:
        result = go()
    except CrashproofError as exc:
        failure = failure_for(exc)
        stopped = (ExitCode.RUN_FAILED, ExitCode.RUN_FROZEN, ExitCode.RUN_INTERRUPTED)
        if settings.json and failure is not None and failure.code in stopped:
            # The run exists and ended (or stopped): scripts get its record too.
            with contextlib.suppress(CrashproofError):
                emit_json(ledger.get_run(run_id).to_json())
        raise
    info = ledger.get_run(run_id)
    if settings.json:
        emit_json(info.to_json())
    else:
        emit_json(result)
        sys.stderr.write(run_summary(info) + "\n")
    return int(ExitCode.OK)


@app.command("run")
def run_command(
    ctx: typer.Context,
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:WORKFLOW",
            show_default=False,
            help="The workflow to run, e.g. flows:upgrade (MODULE is imported from the "
            "current directory first, like python -m).",
        ),
    ],
    run_id: Annotated[
        str,
        typer.Option(
            "--run-id",
            metavar="ID",
            show_default=False,
            help="The run's stable id, derived from business intent; it is the run's "
            "idempotency key.",
        ),
    ],
    arg: Annotated[
        list[str] | None,
        typer.Option(
            "--arg",
            "-a",
            metavar="KEY=VALUE",
            show_default=False,
            help="A workflow argument; VALUE is parsed as JSON when it is valid JSON, "
            "else kept as a string. Repeatable.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Start a run, or resume it if it exists with the same input; print its result.

    Running the same --run-id again returns the recorded result without repeating any
    step; the same --run-id with other --arg values is a conflict (exit 4).
    """
    settings = _settings(ctx, db, as_json, verbose)
    workflow = load_workflow(target)
    args = parse_args(arg or [])
    if not run_id.strip():
        raise CliError(ExitCode.USAGE, "--run-id is empty", "give the run a stable, non-empty id")
    try:
        workflow.bind_input(args)
    except TypeError as exc:
        params = list(inspect.signature(workflow.fn).parameters)[1:]
        raise CliError(
            ExitCode.USAGE,
            str(exc),
            f"{target} takes: {', '.join(params) or 'no arguments'} (pass them with --arg)",
        ) from exc
    with open_ledger(settings, create=True) as ledger:
        ledger.register(workflow)
        return _finish(
            ledger, settings, run_id, lambda: ledger.run(workflow, run_id=run_id, **args)
        )


def _app_policies(module_names: list[str]) -> list[Policy]:
    """Every cp.Policy instance in the given modules' globals."""
    found: dict[int, Policy] = {}
    for name in module_names:
        for obj in vars(import_module(name)).values():
            if isinstance(obj, Policy):
                found.setdefault(id(obj), obj)
    return list(found.values())


@app.command("resume")
def resume_command(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to resume.")
    ],
    app_modules: Annotated[
        list[str],
        typer.Option(
            "--app",
            metavar="MODULE",
            show_default=False,
            help="Module whose workflows are registered (every crashproof workflow in its "
            "globals), and policies (every cp.Policy). Repeatable.",
        ),
    ],
    raise_budget: Annotated[
        list[str] | None,
        typer.Option(
            "--raise-budget",
            metavar="KIND=LIMIT",
            show_default=False,
            help="Raise one of the run's limits to LIMIT (the new total, not an increment; "
            "'none' lifts it). KIND: steps, decisions, tokens, cost, wall_time (seconds "
            "since the run first started). Journaled with --by. Repeatable.",
        ),
    ] = None,
    rebind_policy: Annotated[
        str | None,
        typer.Option(
            "--rebind-policy",
            metavar="VERSION",
            show_default=False,
            help="Bind the run to the cp.Policy of this version found in the --app modules "
            "(journaled with --by), instead of the policy it recorded.",
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            metavar="NAME",
            show_default=False,
            help="Who raises the budget or re-binds the policy (default: the OS user).",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Resume a run in this process and drive it to completion; print its result.

    Recorded steps are replayed, never re-executed; a run that already ended returns its
    recorded outcome. A run stopped at a budget (status stopped, reason budget:KIND)
    exits 6 until its limit is raised with --raise-budget KIND=LIMIT.
    """
    settings = _settings(ctx, db, as_json, verbose)
    workflows = app_workflows(app_modules)
    policies = _app_policies(app_modules)
    try:
        raises = parse_raises(raise_budget or []) or None
    except ValueError as exc:
        raise CliError(
            ExitCode.USAGE, str(exc), "e.g. --raise-budget tokens=5000 --raise-budget cost=2.5"
        ) from None
    rebind = None
    if rebind_policy is not None:
        rebind = next((p for p in policies if p.version == rebind_policy), None)
        if rebind is None:
            offered = ", ".join(sorted(p.version for p in policies)) or "none"
            raise CliError(
                ExitCode.USAGE,
                f"no cp.Policy with version {rebind_policy!r} in the --app modules "
                f"(found: {offered})",
                "define the policy in a module and pass it with --app",
            )
    with open_ledger(settings, create=False) as ledger:
        for workflow in workflows:
            ledger.register(workflow)
        for policy in policies:
            ledger.register_policy(policy)
        if raises or rebind is not None:  # refuse bad operator input as usage, before anything
            try:
                operator(by)
                if raises:
                    raise_limits(ledger.get_run(run_id).limits or Limits(), raises)
            except ValueError as exc:
                raise CliError(
                    ExitCode.USAGE,
                    str(exc),
                    "--raise-budget sets a new, higher limit; see `crashproof show RUN_ID` "
                    "for the current ones",
                ) from None
        return _finish(
            ledger,
            settings,
            run_id,
            lambda: ledger.resume(run_id, raise_budget=raises, rebind_policy=rebind, by=by),
        )


@app.command("runs")
def runs_command(
    ctx: typer.Context,
    status: Annotated[
        RunStatus | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            show_default=False,
            help=f"Only runs with this status: {', '.join(s.value for s in RunStatus)}.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """List the runs in the ledger, oldest first."""
    settings = _settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        infos = ledger.runs(status)
    if settings.json:
        emit_json([info.to_json() for info in infos])
    else:
        print_runs(console(), infos, status.value if status is not None else None)
    return int(ExitCode.OK)


@app.command("show")
def show_command(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to show.")
    ],
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Show one run: header, step timeline, then result, error or evidence."""
    settings = _settings(ctx, db, as_json, verbose)
    with open_ledger(settings, create=False) as ledger:
        info = ledger.get_run(run_id)
    if settings.json:
        emit_json(info.to_json())
    else:
        print_run(console(), info)
    return int(ExitCode.OK)


@app.command("reconcile")
def reconcile_command(
    ctx: typer.Context,
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[RUN_ID]", show_default=False, help="The run to check (default: all)."
        ),
    ] = None,
    app_modules: Annotated[
        list[str] | None,
        typer.Option(
            "--app",
            metavar="MODULE",
            show_default=False,
            help="Module whose crashproof tools (Tool instances in its globals) answer the "
            "lookups. Repeatable.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Compare every recorded receipt with the tool's own lookup (read-only).

    Each act is confirmed, drifted (the world no longer matches the journal) or
    needs_review (nobody can tell). Exit 0 when all are confirmed, 4 when any drifted,
    3 when some need review.
    """
    settings = _settings(ctx, db, as_json, verbose)
    tools = app_tools(app_modules or [])
    with open_ledger(settings, create=False) as ledger:
        run_ids = [run_id] if run_id is not None else [info.run_id for info in ledger.runs()]
        checks = [check for rid in run_ids for check in ledger.reconcile(rid, tools)]
    if settings.json:
        emit_json([check.to_json() for check in checks])
    else:
        print_checks(console(), checks)
    statuses = {check.status for check in checks}
    if "drifted" in statuses:
        return int(ExitCode.CONFLICT)
    if "needs_review" in statuses:
        return int(ExitCode.RUN_FROZEN)
    return int(ExitCode.OK)


@app.command("demo")
def demo_command(
    ctx: typer.Context,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            metavar="DIR",
            show_default=False,
            help="Directory for the demo's files (default: a temporary directory).",
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> int:
    """Watch crashproof survive crashes: the built-in demo scenario, crashed and resumed."""
    _settings(ctx, None, False, verbose)
    try:
        # Imported here: the demo pulls in the verifier, which plain commands never need.
        from crashproof.verify.demo import run_demo
    except ModuleNotFoundError as exc:
        if exc.name not in ("crashproof.verify", "crashproof.verify.demo"):
            raise
        raise CliError(
            ExitCode.USAGE,
            "the demo is not available in this installation of crashproof",
            "reinstall crashproof (pip install --force-reinstall crashproof)",
        ) from exc
    return int(run_demo(console(), workdir=workdir))


class VerifyMode(enum.StrEnum):
    """How ``crashproof verify`` crashes a run."""

    INPROC = "inproc"
    SUBPROCESS = "subprocess"


@app.command("verify")
def verify_command(
    ctx: typer.Context,
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:SCENARIO",
            show_default=False,
            help="The crashproof.verify.Scenario to verify, e.g. examples.patch_task:SCENARIO "
            "(MODULE is imported from the current directory first, like python -m).",
        ),
    ],
    mode: Annotated[
        VerifyMode,
        typer.Option(
            "--mode",
            help="inproc: a simulated crash unwinds the run, a new Ledger object resumes it "
            "(fast). subprocess: a child process is killed by SIGKILL at each crash point "
            "(realistic).",
        ),
    ] = VerifyMode.INPROC,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            metavar="N",
            show_default=False,
            help="Seed of the random sample of crash points (default: a random seed, "
            "printed with the report).",
        ),
    ] = None,
    max_points: Annotated[
        int | None,
        typer.Option(
            "--max-points",
            metavar="N",
            min=1,
            show_default=False,
            help="Crash at most N points, and as many double crashes, drawn with the seed "
            "(default: every crash point).",
        ),
    ] = None,
    recovery_points: Annotated[
        int,
        typer.Option(
            "--recovery-points",
            metavar="N",
            min=0,
            help="Double crashes: crash again at each of the first N crash points of every "
            "recovery.",
        ),
    ] = 3,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            metavar="N",
            min=1,
            help="Run N trials at once, in threads (subprocess mode gains the most; the "
            "scenario's factories must be thread-safe).",
        ),
    ] = 1,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Prove a workflow's recovery: crash it at every crash point, resume, compare.

    One uninterrupted reference run gives the artifact fingerprint, the effects per
    operation id and the model calls; then every crash point (each side of every journal
    commit, inside tools' effects, and during recovery) is crashed and resumed. Each ends
    SAME, REFUSED (stopped for review, with its reason) or DIVERGED. Exit code 0 when
    nothing DIVERGED, 1 otherwise.
    """
    settings = _settings(ctx, None, as_json, verbose)
    # Imported here: plain commands never need the verifier.
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from crashproof.cli.loading import import_module
    from crashproof.verify import Scenario, ScenarioError, verify
    from crashproof.verify.render import print_report

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(
            ExitCode.USAGE,
            f"{target!r} does not name a scenario",
            "name it as MODULE:SCENARIO, e.g. `crashproof verify examples.patch_task:SCENARIO`",
        )
    scenario: object = import_module(module_name)
    for part in attr.split("."):
        scenario = getattr(scenario, part, None)
    if not isinstance(scenario, Scenario):
        raise CliError(
            ExitCode.USAGE,
            f"{target} is not a crashproof.verify.Scenario",
            "define SCENARIO = crashproof.verify.Scenario(...) in the module; see examples/",
        )
    columns = (
        TextColumn("verify"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("reference run", total=None)

        def tick(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label[:60])

        try:
            report = verify(
                scenario,
                mode="subprocess" if mode is VerifyMode.SUBPROCESS else "inproc",
                seed=seed,
                max_points=max_points,
                recovery_points=recovery_points,
                target=target,
                workers=workers,
                progress=tick,
            )
        except ScenarioError as exc:
            raise CliError(
                ExitCode.USAGE, str(exc), "run the scenario once without crashes and fix it"
            ) from exc
    if settings.json:
        emit_json(report.to_json())
    else:
        print_report(console(), report)
    # 1, as for a failed run: the workflow's recovery is not equivalent somewhere.
    return int(ExitCode.OK) if report.ok else int(ExitCode.RUN_FAILED)


@app.command("check")
def check_command(
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
    witness (like git fsck; read-only). Exit 0 when every run is sound, 5 otherwise."""
    settings = _settings(ctx, db, as_json, verbose)
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


@app.command("reanchor")
def reanchor_command(
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
    settings = _settings(ctx, db, False, verbose)
    with open_ledger(settings, create=False) as ledger:
        generation = ledger.reanchor(run_id, by=by)
    sys.stderr.write(f"run {run_id!r} re-anchored at generation {generation} by {by}\n")
    return int(ExitCode.OK)


@app.command("keygen")
def keygen_command(
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
    verbose: VerboseOption = False,
) -> int:
    """Make a new random journal key (64 hex digits) for CRASHPROOF_KEY or a key file."""
    _settings(ctx, None, False, verbose)
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
