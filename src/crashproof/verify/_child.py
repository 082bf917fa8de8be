"""The child process of subprocess mode: run a scenario until a crash point, then die.

Usage: ``python -m crashproof.verify._child MODULE:ATTRIBUTE DIR N``

Imports the scenario, opens (or reopens) its environment in ``DIR/env`` and its ledger at
``DIR/ledger.db``, and runs (or resumes) the run. At the ``N``-th crash point it passes, it
writes the point's name to ``DIR/crashed-at`` and kills itself with SIGKILL: no ``finally``,
no ``atexit``, no buffered write survives but what the operating system already holds.
Exit status otherwise: 0 the run finished first, 3 it stopped frozen, 1 it failed.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

from crashproof._faults import CrashPoints
from crashproof.errors import RunFrozen
from crashproof.runtime.ledger import Ledger
from crashproof.verify.scenario import close_env, load_scenario
from crashproof.verify.trials import CRASHED_AT, DURABILITY, env_dir, ledger_url

__all__ = ["main"]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: python -m crashproof.verify._child MODULE:ATTR DIR N\n")
        return 2
    target, directory, at = argv[0], Path(argv[1]), int(argv[2])
    scenario = load_scenario(target)

    def die(point: str) -> None:
        (directory / CRASHED_AT).write_text(point, encoding="utf-8")
        os.kill(os.getpid(), signal.SIGKILL)

    points = CrashPoints(at=at, action=die) if at > 0 else None
    env = scenario.env_factory(env_dir(directory))
    try:
        with Ledger(ledger_url(directory), durability=DURABILITY, crash_points=points) as ledger:
            workflow = scenario.workflow_factory(env)
            ledger.run(workflow, run_id=scenario.resolved_run_id, **scenario.inputs)
    except RunFrozen as exc:
        sys.stderr.write(f"run frozen: {exc}\n")
        return 3
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        close_env(env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
