"""Where a command's settings come from: options, the environment, defaults.

``--db``, ``--json`` and ``--verbose`` are accepted both before the command
(``crashproof --db X runs``) and after it (``crashproof runs --db X``); the
command's own value wins. The ledger URL then falls back to ``$CRASHPROOF_DB``,
then to ``sqlite:///crashproof.db`` (SQLAlchemy's rule: three slashes for a
path relative to the current directory, four for an absolute one).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.runtime.driving.urls import sqlite_file
from crashproof.runtime.ledger import DURABILITY_MODES, Ledger
from crashproof.runtime.port import ActSettings

__all__ = [
    "DEFAULT_DB",
    "ENV_DB",
    "ByOption",
    "DbOption",
    "JsonOption",
    "Settings",
    "State",
    "VerboseOption",
    "command_settings",
    "open_ledger",
    "sqlite_path",
]

DEFAULT_DB = "sqlite:///crashproof.db"
ENV_DB = "CRASHPROOF_DB"
ENV_DURABILITY = "CRASHPROOF_DURABILITY"  # output (default), full or normal
# Seconds the ledger's clocks may disagree (ActSettings): approvals, idempotency windows.
ENV_SKEW = "CRASHPROOF_MAX_CLOCK_SKEW"
ENV_MARGIN = "CRASHPROOF_WINDOW_MARGIN"
_URL_HINT = "use sqlite:///relative.db, sqlite:////absolute/path.db or memory://"

# The three options every command accepts, and the root callback too (see the module
# docstring); typer reads these declarations when app.py registers a command.
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
# Who takes an operator action (cancel, fork, retry, reconcile --record): journaled with it.
ByOption = Annotated[
    str | None,
    typer.Option(
        "--by",
        metavar="NAME",
        show_default=False,
        help="Who takes this action, journaled with it (default: the OS user).",
    ),
]


@dataclass(slots=True)
class State:
    """Options given before the command; ``main`` reads ``verbose`` after a failure."""

    db: str | None = None
    json: bool = False
    verbose: bool = False


@dataclass(frozen=True, slots=True)
class Settings:
    """A command's resolved settings."""

    db: str
    db_source: str  # where the URL came from, for error messages
    json: bool
    verbose: bool


def resolve(state: State, *, db: str | None, as_json: bool, verbose: bool) -> Settings:
    """Merge a command's own options over the global ones, and configure logging."""
    state.verbose = state.verbose or verbose
    if state.verbose:
        # Only the CLI configures logging; the library only logs.
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
    url, source = db, "--db"
    if url is None:
        url = state.db
    if url is None:
        url, source = os.environ.get(ENV_DB) or None, f"${ENV_DB}"
    if url is None:
        url, source = DEFAULT_DB, "the default"
    return Settings(db=url, db_source=source, json=state.json or as_json, verbose=state.verbose)


def command_settings(ctx: typer.Context, db: str | None, as_json: bool, verbose: bool) -> Settings:
    """A command's settings: its own --db/--json/--verbose over the root callback's."""
    return resolve(ctx.ensure_object(State), db=db, as_json=as_json, verbose=verbose)


def sqlite_path(url: str) -> Path | None:
    """The file behind a ``sqlite:///`` URL (None for other URLs); a query string is a
    usage error (see ``sqlite_file``)."""
    try:
        return sqlite_file(url)
    except ValueError as exc:
        raise CliError(ExitCode.USAGE, f"bad ledger URL: {exc}", _URL_HINT) from None


def open_ledger(settings: Settings, *, create: bool) -> Ledger:
    """Open the ledger. Read commands (``create=False``) never create a missing file."""
    path = sqlite_path(settings.db)
    if not create and path is not None and not path.exists():
        raise CliError(
            ExitCode.LEDGER_UNUSABLE,
            f"no ledger at {path} (URL {settings.db!r} from {settings.db_source}); "
            "nothing was created",
            f"check --db or ${ENV_DB}; `crashproof run` creates a new ledger",
        )
    durability = os.environ.get(ENV_DURABILITY) or DURABILITY_MODES[0]
    if durability not in DURABILITY_MODES:
        raise CliError(
            ExitCode.USAGE,
            f"${ENV_DURABILITY} is {durability!r}, not a durability mode; nothing was changed",
            f"set it to one of {', '.join(DURABILITY_MODES)} (default: output), or unset it",
        )
    act_settings = _act_settings()
    try:
        return Ledger(settings.db, durability=durability, act_settings=act_settings)
    except ValueError as exc:
        raise CliError(
            ExitCode.USAGE, f"bad ledger URL from {settings.db_source}: {exc}", _URL_HINT
        ) from exc


def _act_settings() -> ActSettings:
    """The act protocol's clock settings from ``$CRASHPROOF_MAX_CLOCK_SKEW`` and
    ``$CRASHPROOF_WINDOW_MARGIN`` (seconds; unset: the defaults), checked."""
    skew, margin = _seconds_env(ENV_SKEW), _seconds_env(ENV_MARGIN)
    return ActSettings(max_clock_skew=5.0 if skew is None else skew, window_margin=margin)


def _seconds_env(name: str) -> float | None:
    text = os.environ.get(name)
    if not text:
        return None
    try:
        seconds = float(text)
        ActSettings(max_clock_skew=seconds)  # the library's own check
    except ValueError:
        raise CliError(
            ExitCode.USAGE,
            f"${name} is {text!r}, not a number of seconds from 0 to 86400; nothing was changed",
            "set it to the seconds two clocks of the ledger may disagree (e.g. 5), or unset it",
        ) from None
    return seconds
