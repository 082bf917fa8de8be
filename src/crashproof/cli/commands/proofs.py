"""`crashproof demo` and `crashproof verify`: showing and proving recovery."""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from crashproof.cli.exitcodes import CliError, ExitCode
from crashproof.cli.render import console, emit_json
from crashproof.cli.settings import JsonOption, VerboseOption, command_settings
from crashproof.integrity.keys import KEY_BYTES

__all__ = ["VerifyMode", "demo", "verify_recovery"]


def demo(
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
    command_settings(ctx, None, False, verbose)
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
    with _scratch_key("demo"):
        return int(run_demo(console(), workdir=workdir))


@contextlib.contextmanager
def _scratch_key(command: str) -> Iterator[None]:
    """The demo's and the verifier's ledgers live and die in their own directories, and
    so does their key: without CRASHPROOF_KEY or CRASHPROOF_KEY_FILE, a throwaway key file
    (their child processes inherit the variable), removed at the end; nothing is written
    to the user's config directory. Said once on stderr."""
    if os.environ.get("CRASHPROOF_KEY") or os.environ.get("CRASHPROOF_KEY_FILE"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix=f"crashproof-{command}-key-") as scratch:
        path = Path(scratch) / "key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
        sys.stderr.write(
            f"crashproof {command}: its ledgers are signed with a throwaway key ({path}, removed "
            "at the end); no key is written to your configuration directory\n"
        )
        os.environ["CRASHPROOF_KEY_FILE"] = str(path)
        try:
            yield
        finally:
            del os.environ["CRASHPROOF_KEY_FILE"]


class VerifyMode(enum.StrEnum):
    """How ``crashproof verify`` crashes a run."""

    INPROC = "inproc"
    SUBPROCESS = "subprocess"
    POWERCUT = "powercut"
    CHAOS = "chaos"


def _contention_points(value: str) -> int | None:
    if value == "all":
        return None
    if value.isdigit():
        return int(value)
    raise CliError(
        ExitCode.USAGE,
        f"--contention-points {value!r} is neither a count nor 'all'; nothing was run",
        "give a number of crash points (0: none) or 'all'",
    )


def verify_recovery(
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
            "(realistic). powercut: the ledger runs in output durability and, after each "
            "crash, it and its witness lose every write their own last sync did not make "
            "durable, as a power loss would. chaos: the child's whole process group (git, "
            "test runners) is SIGKILLed at random times, its recovery too in some trials "
            "(--trials).",
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
    contention_points: Annotated[
        str,
        typer.Option(
            "--contention-points",
            metavar="N|all",
            help="At N crash points (drawn with the seed; 'all': every one, 0: none), also "
            "run two recoverers at once (racing, and one taking over from the other) and a "
            "stale checkpoint (the run moved out there and continued elsewhere; a copy "
            "taken there imported after the run went on) (inproc and subprocess modes).",
        ),
        # crashproof.verify.report.DEFAULT_CONTENTION_POINTS, spelled out: plain commands never
        # import the verifier (a test pins the two equal).
    ] = "2",
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
    trials: Annotated[
        int,
        typer.Option(
            "--trials",
            metavar="N",
            min=1,
            help="Chaos mode: N wall-clock kill trials, their delays drawn with the seed.",
        ),
        # crashproof.verify.runner.DEFAULT_TRIALS, spelled out (see --contention-points).
    ] = 20,
    faults: Annotated[
        str,
        typer.Option(
            "--faults",
            metavar="LIST",
            help="Chaos mode: the faults drawn per trial, comma-separated: kill (the run's "
            "process group SIGKILLed), worker (the run driven by crashproof workers, one "
            "killed, the next must take over and finish it), outage (the scenario's model "
            "down past its retries: a worker must resume the run by itself; needs "
            "Scenario(outage=...)), powercut (the kill is a power cut: the ledger and its "
            "witness go back to their last fsync), restart (the PostgreSQL server crashed "
            "and restarted while a worker drives the run: needs --ledger-url and "
            "--pg-restart-command).",
        ),
    ] = "kill",
    ledger_url: Annotated[
        str | None,
        typer.Option(
            "--ledger-url",
            metavar="URL",
            show_default=False,
            help="Chaos mode: a PostgreSQL database for the trials' ledgers (postgresql://..., "
            "no schema=; each trial makes schemas v_<hash> and v_<hash>_witness there and "
            "leaves them: use a scratch database). Default: a SQLite file per trial.",
        ),
    ] = None,
    pg_restart_command: Annotated[
        str | None,
        typer.Option(
            "--pg-restart-command",
            metavar="CMD",
            show_default=False,
            help="Chaos fault restart: the shell command that crashes and restarts the server "
            "of --ledger-url and exits 0 once it is back, e.g. 'pg_ctl -D DATA -m immediate "
            "-w restart'. The verifier restarts no server it was not told how to control.",
        ),
    ] = None,
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
    settings = command_settings(ctx, None, as_json, verbose)
    contention = _contention_points(contention_points)
    chosen = tuple(part.strip() for part in faults.split(",") if part.strip())
    known = ("kill", "worker", "outage", "powercut", "restart")  # verify.chaos.FAULTS
    if not chosen or set(chosen) - set(known):
        raise CliError(
            ExitCode.USAGE,
            f"--faults {faults!r} names no fault, or one that is not known; nothing was run",
            "give some of kill, worker, outage, powercut, restart, e.g. --faults kill,powercut",
        )
    from crashproof.verify.runner import check_store

    try:  # a store the mode cannot use, a fault not applicable to the store
        check_store(mode.value, chosen, ledger_url, pg_restart_command)
    except ValueError as exc:
        raise CliError(
            ExitCode.USAGE,
            f"{exc}; nothing was run",
            "see `crashproof verify --help` (--faults, --ledger-url, --pg-restart-command)",
        ) from None
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
    with (
        _scratch_key("verify"),
        Progress(*columns, console=Console(stderr=True), transient=True) as bar,
    ):
        task = bar.add_task("reference run", total=None)

        def tick(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label[:60])

        try:
            report = verify(
                scenario,
                mode=mode.value,
                seed=seed,
                max_points=max_points,
                recovery_points=recovery_points,
                contention_points=contention,
                target=target,
                workers=workers,
                progress=tick,
                trials=trials,
                faults=chosen,
                ledger=ledger_url,
                restart_command=pg_restart_command,
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
