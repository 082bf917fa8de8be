"""resume and leases: a run another worker holds is refused, unless --take-over."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from crashproof.cli import ExitCode
from crashproof.store.sqlite import SQLiteStore

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result


def test_resume_of_a_held_run_is_refused_and_take_over_proceeds(project: Path, cli: Cli) -> None:
    ran = cli("run", "flows:greet", "--run-id", "greet:1", "--arg", "name=ada")
    assert ran.code == ExitCode.OK, ran.err
    store = SQLiteStore(project / "crashproof.db")
    try:
        store.claim("greet:1", "elsewhere:1:abcd", 60.0)
    finally:
        store.close()

    refused = cli("resume", "greet:1", "--app", "flows")
    assert refused.code == ExitCode.CONFLICT
    assert "owned by worker elsewhere:1:abcd until " in refused.err

    taken = cli("resume", "greet:1", "--app", "flows", "--take-over")
    assert taken.code == ExitCode.OK, taken.err
    assert taken.out == ran.out
