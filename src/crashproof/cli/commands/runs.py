"""`crashproof run`, `resume`, `retry`, `runs`, `show` and `reconcile`: starting runs,
driving them on, and looking at them.

Each command is a thin shell over the Ledger. Commands raise; ``crashproof.cli.main``
turns every error into one error line, one hint line and an exit code (see
``crashproof.cli.exitcodes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import shlex
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from crashproof.cli.contents import content_json, print_content
from crashproof.cli.exitcodes import CliError, ExitCode, failure_for
from crashproof.cli.limits import MaxCost, MaxDecisions, MaxSteps, MaxTokens, MaxWall, run_options
from crashproof.cli.loading import (
    app_policies,
    app_tools,
    app_workflows,
    load_policy,
    load_workflow,
    parse_args,
)
from crashproof.cli.render import (
    console,
    emit_json,
    print_checks,
    print_run,
    retry_json,
    retry_line,
    run_summary,
    safe,
    undelivered,
)
from crashproof.cli.settings import (
    ByOption,
    DbOption,
    JsonOption,
    Settings,
    VerboseOption,
    command_settings,
    open_ledger,
)
from crashproof.cli.timeline import environments_table, print_timeline
from crashproof.errors import CrashproofError, LeaseHeld
from crashproof.journal.records import Limits, RunInfo
from crashproof.runtime.guards.budget import operator, parse_raises, raise_limits
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.operations.audit import run_timeline
from crashproof.runtime.operations.contents import step_contents
from crashproof.runtime.operations.redaction import Redaction
from crashproof.runtime.options import RunOptions
from crashproof.store.queue import retryable_stop

__all__ = [
    "AppModules",
    "drive_and_report",
    "reconcile_runs",
    "resume_run",
    "resume_through_shell",
    "retry_run",
    "show_run",
    "start_run",
]

_PAGE = 200  # steps `crashproof show` prints unless told (--limit): a long run pages


# --app of the commands that drive runs (resume, retry): required, repeatable.
AppModules = Annotated[
    list[str],
    typer.Option(
        "--app",
        metavar="MODULE",
        show_default=False,
        help="Module whose workflows are registered (every crashproof workflow in its "
        "globals), and policies (every cp.Policy). Repeatable.",
    ),
]


def drive_and_report(ledger: Ledger, settings: Settings, run_id: str, go: Callable[[], Any]) -> int:
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


def start_run(
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
    max_steps: MaxSteps = None,
    max_decisions: MaxDecisions = None,
    max_tokens: MaxTokens = None,
    max_cost: MaxCost = None,
    max_wall: MaxWall = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            metavar="MODULE:ATTRIBUTE",
            show_default=False,
            help="A cp.Policy the run is bound to (allowlist, scopes, risk, approvals); "
            "recorded when the run starts.",
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
    settings = command_settings(ctx, db, as_json, verbose)
    workflow = load_workflow(target)
    args = parse_args(arg or [])
    if not run_id.strip():
        raise CliError(ExitCode.USAGE, "--run-id is empty", "give the run a stable, non-empty id")
    if safe(run_id) != run_id:  # it would be shown on terminals: ESC[2J clears one
        raise CliError(
            ExitCode.USAGE,
            f"--run-id {run_id!r} holds control characters; nothing was started",
            "use printable characters, e.g. repo:x:upgrade:2026-08-14",
        )
    try:
        workflow.bind_input(args)
    except TypeError as exc:
        params = list(inspect.signature(workflow.fn).parameters)[1:]
        raise CliError(
            ExitCode.USAGE,
            str(exc),
            f"{target} takes: {', '.join(params) or 'no arguments'} (pass them with --arg)",
        ) from exc
    options = run_options(max_steps, max_decisions, max_tokens, max_cost, max_wall)
    if policy is not None:
        limits = options.limits if options is not None else None
        options = RunOptions(limits=limits, policy=load_policy(policy))
    with open_ledger(settings, create=True) as ledger:
        ledger.register(workflow)
        return drive_and_report(
            ledger,
            settings,
            run_id,
            lambda: (
                asyncio.run(ledger.run_async(workflow, run_id=run_id, options=options, **args))
                if workflow.is_async
                else ledger.run(workflow, run_id=run_id, options=options, **args)
            ),
        )


def resume_run(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to resume.")
    ],
    app_modules: AppModules,
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
            help="Who raises the budget, re-binds the policy or overrides an intent held "
            "by another run (default: the OS user).",
        ),
    ] = None,
    override_intent: Annotated[
        list[str] | None,
        typer.Option(
            "--override-intent",
            metavar="RUN",
            show_default=False,
            help="Let the act this run waits at (stopped: another run holds its intent) go "
            "on although RUN holds the same intent unresolved (in flight, unknown or "
            "frozen): it may then happen twice. "
            "Journaled with --by. Repeatable, one per holding run.",
        ),
    ] = None,
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over",
            help="Take the run over from the worker holding its lease, even before the "
            "lease expires; that worker is fenced out (its next journal write is refused).",
        ),
    ] = False,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            metavar="SECONDS",
            help="If another worker holds the run, wait up to SECONDS for it to be "
            "released or to expire before giving up (exit 4).",
        ),
    ] = 0.0,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Resume a run in this process and drive it to completion; print its result.

    Recorded steps are replayed, never re-executed; a run that already ended returns its
    recorded outcome. A run stopped at a budget (status stopped, reason budget:KIND)
    exits 6 until its limit is raised with --raise-budget KIND=LIMIT.
    """
    settings = command_settings(ctx, db, as_json, verbose)
    workflows = app_workflows(app_modules)
    policies = app_policies(app_modules)
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
        if raises or rebind is not None or override_intent:  # bad operator input: usage
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
        return drive_and_report(
            ledger,
            settings,
            run_id,
            lambda: resume_through_shell(
                ledger,
                run_id,
                raise_budget=raises,
                rebind_policy=rebind,
                by=by,
                take_over=take_over,
                wait=wait,
                override_intent=override_intent or (),
            ),
        )


def retry_run(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The failed run.")
    ],
    app_modules: AppModules,
    by: ByOption = None,
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over",
            help="Take the run over from the worker holding its lease (it is fenced out).",
        ),
    ] = False,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            metavar="SECONDS",
            help="If another worker holds the run, wait up to SECONDS for its lease.",
        ),
    ] = 0.0,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Retry a failed run under its own id and drive it to completion; print its result.

    The retry is journaled (who, when). The call that failed is attempted again; every
    other recorded step, decision and act replays, so no effect recorded before the
    failure happens twice. A run that is not failed is refused (exit 4), nothing written.
    """
    settings = command_settings(ctx, db, as_json, verbose)
    workflows = app_workflows(app_modules)
    policies = app_policies(app_modules)
    try:
        operator(by)
    except ValueError as exc:
        raise CliError(ExitCode.USAGE, str(exc), "e.g. --by alice") from None
    with open_ledger(settings, create=False) as ledger:
        for workflow in workflows:
            ledger.register(workflow)
        for policy in policies:
            ledger.register_policy(policy)
        return drive_and_report(
            ledger,
            settings,
            run_id,
            lambda: resume_through_shell(
                ledger, run_id, retry=True, by=by, take_over=take_over, wait=wait
            ),
        )


def resume_through_shell(ledger: Ledger, run_id: str, **how: Any) -> Any:
    """Resume through the shell the run's workflow needs (an async one on a loop of its own)."""
    row = ledger.store.get_run(run_id)
    workflow = None if row is None else ledger.workflows.get(row.workflow)
    if workflow is not None and workflow.is_async:
        return asyncio.run(ledger.resume_async(run_id, **how))
    return ledger.resume(run_id, **how)


def _marked(info: RunInfo) -> dict[str, Any]:
    """A run's JSON, with ``undelivered``: N when outbox messages are still pending."""
    pending = undelivered(info)
    return {**info.to_json(), **({"undelivered": pending} if pending else {})}


def show_run(
    ctx: typer.Context,
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", show_default=False, help="The run to show.")
    ],
    timeline: Annotated[
        bool,
        typer.Option(
            "--timeline",
            help="Every journal record instead: when, what, and who wrote it (worker, "
            "operator) with which crashproof, workflow and policy versions.",
        ),
    ] = False,
    first: Annotated[
        int,
        typer.Option("--from", min=1, help="The first step shown (1-based): a page of a long run."),
    ] = 1,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=1,
            help=f"At most this many steps (default: all with --json, else {_PAGE}).",
        ),
    ] = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            metavar="KEY",
            help="What one step holds instead: its value, an act's params and receipt, a "
            "model call's reply and tool calls, a failure's traceback, a workspace diff.",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Show one run: header, step timeline, then result, error or evidence."""
    settings = command_settings(ctx, db, as_json, verbose)
    if step is not None:
        return _show_step(settings, run_id, step)
    with open_ledger(settings, create=False) as ledger:
        info = ledger.get_run(run_id)
        info = Redaction.of(ledger.journal(run_id)).info(info)  # its policy's secrets hidden
        entries = run_timeline(ledger, run_id) if timeline else None
        retry: dict[str, Any] = {}
        if retryable_stop(info.status.value, info.reason):  # when a worker resumes it
            retry = retry_json(info.status.value, info.reason, ledger.leases().get(run_id))
    total, pending = len(info.steps), undelivered(info)  # counted before a page is cut
    if limit is None and not settings.json:
        limit = _PAGE
    if first > 1 or (limit is not None and total > limit):  # one page of the steps
        end = total if limit is None else min(total, first - 1 + limit)
        info = dataclasses.replace(info, steps=info.steps[first - 1 : end])
    if entries is not None:
        if settings.json:
            emit_json({"run_id": run_id, "status": info.status.value, "timeline": entries})
        else:
            print_timeline(console(), run_id, entries, info.evidence)
    elif settings.json:
        body = {**info.to_json(), **retry, **({"undelivered": pending} if pending else {})}
        emit_json({**body, "steps_total": total} if total != len(info.steps) else body)
    else:
        print_run(console(), info)
        if retry:  # nobody needs to type resume: say when a worker does
            console().print(retry_line(retry), style="yellow")
        if len(info.steps) < total:
            shown = f"{first}-{first + len(info.steps) - 1}" if info.steps else "none"
            after = first + len(info.steps)
            more = f"; next page: --from {after}" if after <= total else ""
            console().print(f"steps {shown} of {total}{more}", style="dim")
        envs = environments_table(info.evidence)
        if envs is not None:
            console().print(envs)
    if pending:  # a succeeded run whose messages never left says so (crashproof dispatch)
        return int(ExitCode.UNDELIVERED)
    return int(ExitCode.OK)


def _show_step(settings: Settings, run_id: str, key: str) -> int:
    with open_ledger(settings, create=False) as ledger:
        ledger.get_run(run_id)  # verified whole first: a refused run is refused here
        kept = lambda: ledger.store.load_requests(run_id)  # noqa: E731  # read only if named
        content = step_contents(ledger.journal(run_id), [key], kept).get(key)
    if content is None:
        raise CliError(
            ExitCode.USAGE,
            f"run {run_id!r} has no recorded step {key!r}",
            f"`crashproof show {shlex.quote(run_id)}` lists its steps",
        )
    if settings.json:
        emit_json(content_json(content))
    else:
        print_content(console(), run_id, content)
    return int(ExitCode.OK)


def reconcile_runs(
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
    record: Annotated[
        bool,
        typer.Option(
            "--record",
            help="Journal each act's finding in its run (who, when, what the lookup "
            "answered); `runs --drifted` and `show` read the latest. No status changes.",
        ),
    ] = False,
    by: ByOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> int:
    """Compare every recorded receipt with the tool's own lookup (read-only unless
    --record).

    Each act is confirmed, drifted (the world no longer matches the journal) or
    needs_review (nobody can tell). Exit 0 when all are confirmed, 4 when any drifted,
    3 when some need review. With --record and no RUN_ID, a run another process is
    driving is skipped (said on stderr); a named one exits as a held run does.
    """
    settings = command_settings(ctx, db, as_json, verbose)
    tools = app_tools(app_modules or [])
    checks: list[Any] = []
    with open_ledger(settings, create=False) as ledger:
        run_ids = [run_id] if run_id is not None else [info.run_id for info in ledger.runs()]
        for rid in run_ids:
            try:
                checks += ledger.reconcile(rid, tools, record=record, by=by)
            except LeaseHeld:
                if run_id is not None:
                    raise
                sys.stderr.write(
                    f"crashproof: run {safe(rid)} is being driven; its findings were not "
                    "recorded (its own resume re-reads its receipts)\n"
                )
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
