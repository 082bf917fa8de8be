"""The command line: the only place that reads env vars, prints, exits or configures logging.

::

    crashproof run MODULE:WORKFLOW --run-id ID [--arg KEY=VALUE ...]
    crashproof resume RUN_ID --app MODULE [--app MODULE ...]
    crashproof runs [--status STATUS]
    crashproof show RUN_ID
    crashproof demo [--workdir DIR]

    --db URL    (before or after the command) ledger URL; default $CRASHPROOF_DB,
                else sqlite:///crashproof.db
    --json      machine-readable JSON on stdout (runs, show, run, resume)
    --verbose   log at INFO on stderr; show tracebacks

Every failure prints ``crashproof: error: <what happened>`` and ``hint: <what to
do>`` on stderr, never a traceback (unless --verbose), and exits with a code
scripts can trust:

====  ==================================================================
code  meaning
====  ==================================================================
0     ok (for run/resume: the run succeeded)
1     the run failed; the failure is recorded and re-running returns it
      (``crashproof retry RUN`` attempts the failed call again)
2     usage or input error (option, module, workflow, --arg, URL, unknown
      run id); nothing was changed
3     the run is frozen (needs_review / awaiting_approval): it waits for a
      human
4     conflict: the run id exists with another input, another worker
      owns the run, the run was exported (moved) to another ledger, or
      a retry of a run that is not failed, a cancel of a run that ended
5     the ledger is unusable (missing, not a ledger, corrupt, newer
      schema, locked); nothing was changed
6     the run stopped before finishing and stays resumable (an error, a
      budget, a service out, another run holding its act's intent): fix
      the cause or wait (a worker resumes a retryable stop), then resume
7     the run was cancelled (``crashproof cancel``): it is never driven
      again (resume, retry, run with its id, the worker); nothing ran
8     show: the run has outbox messages still undelivered (a target was
      down); ``crashproof dispatch --app MODULE`` delivers them
70    internal error (a bug): rerun with --verbose for the traceback
130   interrupted (Ctrl-C)
128+N stopped by signal N, not by crashproof (SIGKILL: 137 in a shell,
      -9 from Python's subprocess; SIGTERM: 143): nothing recorded is
      lost, and the run resumes where it stopped. 135 (SIGBUS) comes
      with an error line: a ledger file became unwritable mid-run
====  ==================================================================

The codes are ``crashproof.cli.exitcodes.ExitCode``; ``crashproof --help`` lists them.
"""

from __future__ import annotations

import sys
import traceback

import typer
import typer.main

from crashproof.cli.app import app
from crashproof.cli.exitcodes import ExitCode, Failure, failure_for
from crashproof.cli.render import print_error
from crashproof.cli.settings import State

__all__ = ["ExitCode", "app", "main", "run_cli"]


def _usage_failure(exc: typer.TyperException) -> Failure:
    ctx = getattr(exc, "ctx", None)  # click's UsageError knows the command it came from
    path = getattr(ctx, "command_path", None) or "crashproof"
    return Failure(ExitCode.USAGE, " ".join(exc.format_message().split()), f"see `{path} --help`")


def _not_utf8(args: list[str]) -> Failure | None:
    """An argument that is not UTF-8 (Python keeps its bytes as lone surrogates) would
    fail deep inside the ledger's encoder; refuse it here, before anything opens."""
    for number, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape")
            return Failure(
                ExitCode.USAGE,
                f"argument {number} ({shown!r}) is not valid UTF-8; nothing was changed",
                "run ids, paths and values are UTF-8 text: check the shell quoting",
            )
    return None


def _escaped_base_exception(exc: BaseException) -> Failure:
    """A workflow (or a tool) raised a BaseException that is not an Exception
    (``GeneratorExit``, ``BaseException`` itself, a simulated crash): the ledger records
    no outcome for it, so the run stays resumable, as after a crash."""
    return Failure(
        ExitCode.RUN_INTERRUPTED,
        f"{type(exc).__name__} escaped the run: {' '.join(str(exc).split()) or 'no message'};"
        " nothing was recorded for it, and the run stays running and resumable",
        "raise an Exception subclass instead; then `crashproof resume RUN_ID --app MODULE` "
        "(once its lease expires, or with --take-over)",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv``; return the exit code (tests call this in-process)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        main(["--help"])
        return int(ExitCode.USAGE)
    bad = _not_utf8(args)
    if bad is not None:
        print_error(bad)
        return int(bad.code)
    state = State()
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="crashproof", standalone_mode=False, obj=state)
    except typer.Abort:
        print_error(Failure(ExitCode.INTERRUPTED, "aborted", ""))
        return int(ExitCode.INTERRUPTED)
    except typer.TyperException as exc:  # bad options or arguments, from click's parser
        print_error(_usage_failure(exc))
        return int(ExitCode.USAGE)
    except Exception as exc:
        failure = failure_for(exc)
        if failure is None:
            failure = Failure(
                ExitCode.INTERNAL,
                f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}",
                "this is a bug; rerun with --verbose for the traceback, and report it",
            )
            if state.verbose:
                traceback.print_exception(exc)
        elif state.verbose and exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__)
        print_error(failure)
        return int(failure.code)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a workflow's GeneratorExit, say
        if state.verbose:
            traceback.print_exception(exc)
        failure = _escaped_base_exception(exc)
        print_error(failure)
        return int(failure.code)
    return rv if isinstance(rv, int) else int(ExitCode.OK)


_SIGBUS_MESSAGE = (
    "crashproof: error: the process received SIGBUS: a memory-mapped file became unusable "
    "(the ledger's -shm or -wal made immutable, or its disk gone); it stopped at once, and "
    "what the journal committed is kept\n"
    "hint: make the ledger's files writable again (lsattr; chattr -i FILE), then "
    "`crashproof resume RUN_ID --app MODULE`\n"
)


def run_cli() -> None:
    """Console-script entry point: ``crashproof`` and ``python -m crashproof``."""
    try:  # the native module is optional (setup.py): without it, SIGBUS ends us silently
        from crashproof.cli import _sigbus
    except ImportError:
        pass
    else:
        _sigbus.install(_SIGBUS_MESSAGE)
    raise SystemExit(main(sys.argv[1:]))
