"""The child process of subprocess mode: run a scenario until a crash point, then die.

Usage: ``python -m crashproof.verify._child MODULE:ATTRIBUTE DIR N [--take-over]
[--pause-at M] [--worker] [--powercut]``

Imports the scenario, opens (or reopens) its environment in ``DIR/env`` and its ledger at
``DIR/ledger.db``, and runs (or resumes) the run. At the ``N``-th crash point it passes, it
writes the point's name to ``DIR/crashed-at`` and kills itself with SIGKILL: no ``finally``,
no ``atexit``, no buffered write survives but what the operating system already holds.
Exit status otherwise: 0 the run finished first, 3 it stopped frozen, 1 it failed, 4 another
recoverer held the run's lease (LeaseHeld), 5 this one was fenced out (StaleLeaseError).

For the two-recoverers cases: ``--take-over`` resumes with ``take_over=True`` (fencing the
current holder out); ``--pause-at M`` writes the name of the ``M``-th crash point to
``DIR/paused-at`` and waits there until ``DIR/go`` exists (another recoverer takes over
meanwhile).

Chaos mode's production faults: ``--worker`` drives the run as a ``crashproof worker``
does instead (``ledger.enqueue`` then a ``cp.Worker``, lease ``WORKER_LEASE`` seconds,
retryable stops tried again after ``WORKER_RETRY`` seconds, doubling), until the run ended
or waits for a person; a killed worker's run is thereby taken over by the next one once
its lease runs out, and a run a service outage stopped is resumed by the worker itself.
``--powercut`` keeps the last durable state of the ledger and its witness
(``DIR/durable``, ``DIR/durable.witness``: crashproof.verify.powercut) as it runs, so that
a chaos power cut puts the files back to it after the kill.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from crashproof._faults import CrashPoints
from crashproof.errors import LeaseHeld, LedgerError, RunFrozen, StaleLeaseError
from crashproof.journal.records import RunStatus
from crashproof.runtime.ledger import Ledger
from crashproof.runtime.worker import Worker
from crashproof.store.queue import retryable_stop
from crashproof.verify.powercut import attach
from crashproof.verify.scenario import Scenario, close_env, load_scenario
from crashproof.verify.trial_kit import (
    CRASHED_AT,
    DURABILITY,
    GO,
    PAUSED_AT,
    RUNNING,
    durable_snapshots,
    env_dir,
    ledger_url,
    run_scenario,
)

__all__ = ["main"]

T = TypeVar("T")

_PAUSE_LIMIT = 120.0  # seconds a paused child waits for GO before it gives up
WORKER_LEASE = 1.0  # seconds: a killed worker's run is free again soon after
WORKER_RETRY = (0.1, 0.8)  # first and longest wait before a stopped run's next attempt


def main(argv: list[str]) -> int:
    take_over = "--take-over" in argv
    as_worker = "--worker" in argv
    powercut = "--powercut" in argv
    args = [a for a in argv if a not in ("--take-over", "--worker", "--powercut")]
    pause_at = 0
    if "--pause-at" in args[3:-1]:
        i = args.index("--pause-at")
        pause_at = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 3:
        sys.stderr.write(
            "usage: python -m crashproof.verify._child MODULE:ATTR DIR N [--take-over] "
            "[--pause-at M] [--worker] [--powercut]\n"
        )
        return 2
    target, directory, at = args[0], Path(args[1]), int(args[2])
    scenario = load_scenario(target)

    def die(point: str) -> None:
        (directory / CRASHED_AT).write_text(point, encoding="utf-8")
        os.kill(os.getpid(), signal.SIGKILL)

    def pause(point: str) -> None:
        (directory / PAUSED_AT).write_text(point, encoding="utf-8")
        deadline = time.monotonic() + _PAUSE_LIMIT
        while not (directory / GO).exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    points = None
    if at > 0:
        points = CrashPoints(at=at, action=die)
    elif pause_at > 0:
        points = CrashPoints(at=pause_at, action=pause)
    env = scenario.env_factory(env_dir(directory))
    (directory / RUNNING).write_text("", encoding="utf-8")  # chaos mode times its kill from here
    try:
        with _open(directory, points, as_worker) as ledger:
            if powercut:
                attach(ledger, durable_snapshots(directory))
            if as_worker:
                return serve_run(scenario, ledger, env)
            run_scenario(scenario, ledger, env, take_over=take_over)
    except RunFrozen as exc:
        sys.stderr.write(f"run frozen: {exc}\n")
        return 3
    except LeaseHeld as exc:
        sys.stderr.write(f"lease held: {exc}\n")
        return 4
    except StaleLeaseError as exc:
        sys.stderr.write(f"fenced out: {exc}\n")
        return 5
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        close_env(env)
    return 0


def _open(directory: Path, points: CrashPoints | None, as_worker: bool) -> Ledger:
    """The trial's ledger. A worker that cannot reach it (the store restarting as it
    starts) tries again (``_again``); anything else fails at once."""
    url = ledger_url(directory)
    if not as_worker:
        return Ledger(url, durability=DURABILITY, crash_points=points)
    return _again(lambda: Ledger(url, durability=DURABILITY, crash_points=points))


def _again(step: Callable[[], T]) -> T:
    """``step``, tried again while the store cannot be reached (a LedgerError: the store
    restarting as a worker starts), as the supervisor a worker runs under would start it
    again (docs/reliability.md), for at most ``_PAUSE_LIMIT`` seconds."""
    deadline = time.monotonic() + _PAUSE_LIMIT
    while True:
        try:
            return step()
        except LedgerError as exc:
            if time.monotonic() > deadline:
                raise
            sys.stderr.write(f"worker: the ledger is unreachable, trying again: {exc}\n")
            time.sleep(0.2)


def serve_run(scenario: Scenario[Any], ledger: Ledger, env: Any) -> int:
    """Drive the scenario's run as a worker would, until it ended (0) or waits for a
    person (3): frozen, or stopped for a reason no later attempt clears."""
    workflow = scenario.workflow_factory(env)
    run_id = scenario.resolved_run_id
    ledger.lease_seconds = WORKER_LEASE
    ledger.register(workflow)
    # A no-op once recorded; the store may be restarting right now (as the watcher's
    # reads below, these would otherwise end the worker: exit 1, a DIVERGED trial).
    _again(lambda: ledger.enqueue(workflow, run_id=run_id, **scenario.inputs))
    first, longest = WORKER_RETRY
    worker = Worker(ledger, poll=0.02, log=sys.stderr, retry_first=first, retry_max=longest)
    status = RunStatus.RUNNING  # until the watcher saw it end or wait for a person

    def watch() -> None:
        nonlocal status
        while True:
            try:
                row = ledger.store.get_run(run_id)
            except Exception as exc:  # the store restarting: ask again (a watcher that
                # died here would leave the worker serving forever)
                sys.stderr.write(f"watcher: the ledger is unreachable, asking again: {exc}\n")
                time.sleep(0.2)
                continue
            if row is not None and (
                row.status.terminal
                or row.status.frozen
                or (
                    row.status is RunStatus.STOPPED
                    and not retryable_stop(row.status.value, row.reason)
                )
            ):
                status = row.status
                worker.stop()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    worker.serve()
    return 0 if status.terminal else 3


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
