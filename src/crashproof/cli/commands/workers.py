"""`crashproof worker`: drive queued and orphaned runs until SIGTERM/SIGINT."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Annotated

import typer

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.limits import MaxCost, MaxDecisions, MaxSteps, MaxTokens, MaxWall, run_options
from crashproof.cli.loading import app_policies, app_tools, app_workflows, load_policy
from crashproof.cli.settings import DbOption, VerboseOption, command_settings, open_ledger
from crashproof.runtime.options import RunOptions
from crashproof.runtime.worker import Worker
from crashproof.tools.outbox import Outbox

__all__ = ["run_worker"]


def run_worker(
    ctx: typer.Context,
    app_modules: Annotated[
        list[str],
        typer.Option(
            "--app",
            metavar="MODULE",
            show_default=False,
            help="Module whose workflows this worker drives (every crashproof workflow in "
            "its globals), and policies (every cp.Policy). Repeatable.",
        ),
    ],
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", "-c", metavar="N", help="Runs driven at once."),
    ] = 4,
    poll: Annotated[
        float,
        typer.Option("--poll", metavar="SECONDS", help="Pause between claims when idle."),
    ] = 1.0,
    lease: Annotated[
        float,
        typer.Option(
            "--lease",
            metavar="SECONDS",
            help="Lease of each claimed run, renewed every third of it; a dead worker's "
            "runs are taken over once it runs out.",
        ),
    ] = 15.0,
    until_idle: Annotated[
        bool,
        typer.Option("--until-idle", help="Exit once nothing is runnable or in flight."),
    ] = False,
    reconcile_every: Annotated[
        str | None,
        typer.Option(
            "--reconcile-every",
            metavar="DURATION",
            show_default=False,
            help="Look up the acts of ended and frozen runs this often (30s, 10m, 1h) with "
            "the --app modules' tools, journaling each finding (as reconcile --record).",
        ),
    ] = None,
    reconcile_limit: Annotated[
        int,
        typer.Option(
            "--reconcile-limit",
            metavar="N",
            help="At most N acts looked up per reconcile pass (a run is never split).",
        ),
    ] = 100,
    on_loop: Annotated[
        bool,
        typer.Option(
            "--async",
            help="Drive every run as a task of one event loop (async workflows awaited, "
            "plain ones in a worker thread): for many concurrent async agents, e.g. "
            "--async --concurrency 1000.",
        ),
    ] = False,
    retry_first: Annotated[
        float,
        typer.Option(
            "--retry-first",
            metavar="SECONDS",
            help="A run stopped for a retryable cause (a model, tool or lookup out) is "
            "tried again this long after it stopped, then twice as long each time.",
        ),
    ] = 5.0,
    retry_max: Annotated[
        float,
        typer.Option(
            "--retry-max",
            metavar="SECONDS",
            help="The longest wait between automatic attempts of a stopped run.",
        ),
    ] = 300.0,
    outbox_every: Annotated[
        float,
        typer.Option(
            "--outbox-every",
            metavar="SECONDS",
            help="Deliver the pending messages of the --app modules' cp.Outbox tools this "
            "often (runs nobody drives; a running run delivers its own).",
        ),
    ] = 30.0,
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
            help="A cp.Policy every run this worker drives must be bound to (enqueued "
            "with it); a run bound to another policy, or to none, is refused before "
            "anything executes and left to other workers. The --max-* limits likewise "
            "must be the ones each run was enqueued with.",
        ),
    ] = None,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Drive runs from the ledger's queue: runs enqueued with ledger.enqueue, runs
    whose worker died (lease expired), and runs stopped for a retryable cause (a model,
    tool or lookup out), again with backoff; N at a time, with no control plane. Runs
    frozen for review or stopped by a budget are left to a person.

    Logs one JSON line per event on stderr. SIGTERM or SIGINT drains: nothing new is
    claimed, each run finishes its current step, its lease is released, and the worker
    exits 0. With --policy/--max-*, only runs bound to that policy and those limits are
    driven (others are refused, logged as "refused" or "error", and left alone).
    """
    settings = command_settings(ctx, db, False, verbose)
    if concurrency < 1 or not poll > 0 or not lease > 0 or not outbox_every > 0:
        raise CliError(
            ExitCode.USAGE,
            f"--concurrency must be >= 1 and --poll, --lease, --outbox-every > 0 (got "
            f"{concurrency}, {poll}, {lease}, {outbox_every}); nothing was started",
            "e.g. crashproof worker --app flows --concurrency 4 --poll 1 --lease 15",
        )
    if not 0 < retry_first <= retry_max or retry_max == float("inf"):
        raise CliError(
            ExitCode.USAGE,
            f"--retry-first must be > 0 and at most --retry-max (got {retry_first}, "
            f"{retry_max}); nothing was started",
            "e.g. crashproof worker --app flows --retry-first 5 --retry-max 300",
        )
    every = None if reconcile_every is None else _duration(reconcile_every)
    if reconcile_limit < 1:
        raise CliError(
            ExitCode.USAGE,
            f"--reconcile-limit must be >= 1 (got {reconcile_limit}); nothing was started",
            "e.g. crashproof worker --app flows --reconcile-every 10m --reconcile-limit 100",
        )
    options = run_options(max_steps, max_decisions, max_tokens, max_cost, max_wall)
    if policy is not None:
        limits = options.limits if options is not None else None
        options = RunOptions(limits=limits, policy=load_policy(policy))
    workflows = app_workflows(app_modules)
    policies = app_policies(app_modules)
    with open_ledger(settings, create=False) as ledger:
        ledger.lease_seconds = lease
        for workflow in workflows:
            ledger.register(workflow)
        for found in policies:  # runs enqueued with a policy find it on resume
            ledger.register_policy(found)
        worker = Worker(
            ledger,
            concurrency=concurrency,
            poll=poll,
            until_idle=until_idle,
            log=sys.stderr,
            options=options,
            on_loop=on_loop,
            outbox=[tool for tool in app_tools(app_modules) if isinstance(tool, Outbox)],
            outbox_every=outbox_every,
            retry_first=retry_first,
            retry_max=retry_max,
            reconcile=app_tools(app_modules) if every is not None else (),
            reconcile_every=every,
            reconcile_limit=reconcile_limit,
        )

        def drain(signum: int, _frame: FrameType | None) -> None:
            worker.stop()

        previous = {sig: signal.signal(sig, drain) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return worker.serve()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    """``30s``, ``10m``, ``1h`` or plain seconds, > 0; else a usage error."""
    value = text.strip().lower()
    number, unit = (value[:-1], value[-1]) if value[-1:] in _UNITS else (value, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise CliError(
            ExitCode.USAGE,
            f"--reconcile-every {text!r} is not a duration; nothing was started",
            "give a positive number of seconds, or one with s, m or h: 30s, 10m, 1h",
        )
    return seconds
