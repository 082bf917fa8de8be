"""The child process of subprocess mode: run a scenario until a crash point, then die.

Usage: ``python -m crashproof.verify._child MODULE:ATTRIBUTE DIR N [--take-over]
[--pause-at M]``

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
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

from crashproof._faults import CrashPoints
from crashproof.errors import LeaseHeld, RunFrozen, StaleLeaseError
from crashproof.runtime.ledger import Ledger
from crashproof.verify.scenario import close_env, load_scenario
from crashproof.verify.trial_kit import (
    CRASHED_AT,
    DURABILITY,
    GO,
    PAUSED_AT,
    RUNNING,
    env_dir,
    ledger_url,
    run_scenario,
)

__all__ = ["main"]

_PAUSE_LIMIT = 120.0  # seconds a paused child waits for GO before it gives up


def main(argv: list[str]) -> int:
    take_over = "--take-over" in argv
    args = [a for a in argv if a != "--take-over"]
    pause_at = 0
    if "--pause-at" in args[3:-1]:
        i = args.index("--pause-at")
        pause_at = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 3:
        sys.stderr.write(
            "usage: python -m crashproof.verify._child MODULE:ATTR DIR N [--take-over] "
            "[--pause-at M]\n"
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
        with Ledger(ledger_url(directory), durability=DURABILITY, crash_points=points) as ledger:
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


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
