"""`crashproof ui`: serve the web console over one ledger (``crashproof.console``).

The console and its server (starlette, jinja2, uvicorn: the ``crashproof[ui]`` extra)
are imported only here, inside the command, so ``import crashproof`` and every other
command work without them.
"""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Any

import typer

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.identity import Operator, configured_operator
from crashproof.cli.loading import app_policies, app_tools, app_workflows
from crashproof.cli.render import safe
from crashproof.cli.settings import DbOption, VerboseOption, command_settings, open_ledger

__all__ = ["serve", "ui"]

DEFAULT_PORT = 8765


def serve(app: Any, host: str, port: int) -> None:
    """Serve ``app`` until Ctrl-C (tests replace this)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning")


def ui(
    ctx: typer.Context,
    ledger_url: Annotated[
        str | None,
        typer.Argument(
            metavar="[LEDGER_URL]",
            show_default=False,
            help="The ledger to show (default: --db, $CRASHPROOF_DB, sqlite:///crashproof.db).",
        ),
    ] = None,
    app_modules: Annotated[
        list[str] | None,
        typer.Option(
            "--app",
            metavar="MODULE",
            show_default=False,
            help="Module whose workflows and policies the Resume button needs, and whose "
            "outbox tools the Dispatch button delivers with. Repeatable.",
        ),
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDRESS",
            help="Address to bind. Anything but the loopback needs --token or --new-token.",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="N", help="Port to bind.")] = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            metavar="TOKEN",
            show_default=False,
            help="Every request must carry this token (Authorization: Bearer, or open "
            "the printed URL once: it sets a cookie).",
        ),
    ] = None,
    new_token: Annotated[
        bool,
        typer.Option("--new-token", help="Generate a token, print it, and require it."),
    ] = False,
    db: DbOption = None,
    verbose: VerboseOption = False,
) -> int:
    """Serve a local web console: runs, a run's steps, what needs attention, and buttons
    to approve, reject, decide a review case, resume, retry, cancel, fork and dispatch.
    They act as your operator identity (`crashproof operator init`, read at start):
    signed where the CLI signs, journaled under its name. Without one the console is
    read-only and says why.

    Binds 127.0.0.1 by default. A non-loopback --host without --token or --new-token is
    refused (exit 2), nothing served.
    """
    try:
        from crashproof.console import ConsoleConfig, Signer, create_app, is_loopback
        from crashproof.console import new_token as make_token
    except ImportError as exc:
        raise CliError(
            ExitCode.USAGE,
            f"the console needs the ui extra ({exc.name or exc} is not installed); "
            "nothing was served",
            "pip install 'crashproof[ui]'",
        ) from None
    settings = command_settings(ctx, ledger_url or db, False, verbose)
    loopback = is_loopback(host)
    if token is not None and not token.strip():
        raise CliError(ExitCode.USAGE, "--token is empty; nothing was served", "give a token")
    if new_token:
        token = make_token()
    if not loopback and not token:
        raise CliError(
            ExitCode.USAGE,
            f"--host {safe(host)} is not a loopback address: the console would answer "
            "anyone who can reach it, so it needs a token; nothing was served",
            "add --new-token (one is generated and printed) or --token TOKEN, "
            "or bind --host 127.0.0.1",
        )
    modules = app_modules or []
    workflows, policies, tools = app_workflows(modules), app_policies(modules), app_tools(modules)
    ledger = open_ledger(settings, create=False)
    try:
        ledger.store.schema_version()  # a file that is not a ledger fails here, not in a page
        for workflow in workflows:
            ledger.register(workflow)
        for policy in policies:
            ledger.register_policy(policy)
        who = configured_operator(ledger)
        db_flag = "" if ledger_url is None and db is None else f"--db {shlex.quote(settings.db)}"
        config = ConsoleConfig(
            ledger=ledger,
            tools=[tool for tool in tools if _is_outbox(tool)],
            token=token,
            loopback=loopback,
            db_flag=db_flag,
            app_flags=" ".join(f"--app {shlex.quote(m)}" for m in modules),
            signer=Signer(who.key, who.name) if isinstance(who, Operator) else None,
            read_only=who if isinstance(who, str) else "",
        )
        app = create_app(config)
        where = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
        sys.stderr.write(f"crashproof ui: {safe(ledger.shown_url)} on {where}\n")
        if token:
            sys.stderr.write(f"open {where}?token={token}  (token: {token})\n")
        if isinstance(who, Operator):
            sys.stderr.write(safe(f"its buttons act as {who.name} (key {who.path})") + "\n")
        else:
            sys.stderr.write(safe(f"read-only: {who}") + "\n")
        sys.stderr.write("Ctrl-C stops it\n")
        sys.stderr.flush()
        serve(app, host, port)
    finally:
        ledger.close()
    return int(ExitCode.OK)


def _is_outbox(tool: Any) -> bool:
    from crashproof.tools.outbox import Outbox

    return isinstance(tool, Outbox)
