"""crashproof cancel: a run stopped for good, journaled and attributed, its lease fenced
(a real child process driving it can append nothing afterwards), never driven again."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.cli import ExitCode
from crashproof.journal.records import EventType

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result
Calls = Callable[[], list[str]]

# A workflow whose second step waits for a file: a child process drives it and sits in
# that step, holding the run's lease, while the test cancels the run from outside.
HELD = """
import pathlib
import time

import crashproof as cp

CALLS = pathlib.Path("calls.log")


def _count(what):
    with CALLS.open("a", encoding="utf-8") as f:
        f.write(what + "\\n")


def first():
    _count("first")
    return 1


def wait_for_go():
    _count("waiting")
    while not pathlib.Path("go").exists():
        time.sleep(0.02)
    _count("went")
    return 2


def last():
    _count("last")
    return 3


@cp.workflow("held", version="1")
def held(ctx):
    return [ctx.step("first", first), ctx.step("wait", wait_for_go), ctx.step("last", last)]


@cp.workflow("capped", version="1")
def capped(ctx):
    return [ctx.step("first", first), ctx.step("last", last)]
"""

CHILD = """
import sys
import crashproof as cp
import held
with cp.Ledger("sqlite:///crashproof.db") as ledger:
    try:
        ledger.run(held.held, run_id="h:1")
    except cp.StaleLeaseError as exc:
        print("fenced:", exc, file=sys.stderr)
        sys.exit(9)
"""


def _journal(project: Path, run_id: str) -> list[Any]:
    with cp.Ledger(f"sqlite:///{project / 'crashproof.db'}") as ledger:
        return ledger.journal(run_id)


def _wait_for(path: Path, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(encoding="utf-8").split():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_cancel_fences_a_child_process_driving_the_run(
    project: Path, cli: Cli, calls: Calls
) -> None:
    (project / "held.py").write_text(HELD, encoding="utf-8")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=project, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(project / "calls.log", "waiting")
        cancelled = cli("cancel", "h:1", "--by", "erin", "--reason", "wrong ticket", "--json")
        assert cancelled.code == ExitCode.OK, cancelled.err
        assert cancelled.json()["by"] == "erin"
        before = _journal(project, "h:1")
        (project / "go").touch()
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 9, err  # its commit after the cancel was refused
    assert "fenced:" in err
    after = _journal(project, "h:1")
    assert [e.seq for e in after] == [e.seq for e in before]  # nothing appended since
    assert after[-1].type is EventType.RUN_CANCELLED
    assert after[-1].payload["reason"] == "wrong ticket"
    assert calls() == ["first", "waiting", "went"]  # "last" never ran

    shown = cli("show", "h:1", "--json")
    assert shown.json()["status"] == "cancelled"
    for argv in (
        ("resume", "h:1", "--app", "held"),
        ("run", "held:held", "--run-id", "h:1"),
    ):
        refused = cli(*argv)
        assert refused.code == ExitCode.RUN_CANCELLED, (argv, refused.err)
        assert "was cancelled by erin (wrong ticket)" in refused.err
    retried = cli("retry", "h:1", "--app", "held")
    assert retried.code == ExitCode.CONFLICT
    assert "cancelled" in retried.err
    worked = cli("worker", "--app", "held", "--until-idle")
    assert worked.code == ExitCode.OK, worked.err
    assert calls() == ["first", "waiting", "went"]  # nobody drove it again
    assert "cancelled by erin: wrong ticket" in cli("show", "h:1").out
    audit = cli("show", "h:1", "--timeline").out
    assert "operator erin@" in audit
    assert "cancelled the run (wrong ticket)" in audit


def test_cancel_of_a_stopped_and_a_queued_run(project: Path, cli: Cli, calls: Calls) -> None:
    (project / "held.py").write_text(HELD, encoding="utf-8")
    sys.path.insert(0, str(project))
    import held  # type: ignore[import-not-found]

    with cp.Ledger(f"sqlite:///{project / 'crashproof.db'}") as ledger:
        options = cp.RunOptions(limits=cp.Limits(max_steps=1))
        with contextlib.suppress(cp.RunStopped):
            ledger.run(held.capped, run_id="s:1", options=options)
        ledger.enqueue(held.capped, run_id="q:1")
    assert cli("show", "s:1", "--json").json()["status"] == "stopped"
    for run_id in ("s:1", "q:1"):
        done = cli("cancel", run_id, "--by", "ops")
        assert done.code == ExitCode.OK, done.err
        assert cli("show", run_id, "--json").json()["status"] == "cancelled"
    worked = cli("worker", "--app", "held", "--until-idle")
    assert worked.code == ExitCode.OK, worked.err
    assert calls() == ["first"]  # the queued run never ran, the stopped one went no further
    again = cli("resume", "s:1", "--app", "held", "--raise-budget", "steps=10")
    assert again.code == ExitCode.RUN_CANCELLED, again.err
    assert "was cancelled" in again.err


def test_cancel_of_an_ended_run_is_refused(project: Path, cli: Cli) -> None:
    ran = cli("run", "flows:greet", "--run-id", "g:1", "--arg", "name=ada")
    assert ran.code == ExitCode.OK, ran.err
    before = len(_journal(project, "g:1"))
    refused = cli("cancel", "g:1")
    assert refused.code == ExitCode.CONFLICT
    assert "is succeeded" in refused.err
    assert "nothing was changed" in refused.err
    assert len(_journal(project, "g:1")) == before
    missing = cli("cancel", "nope:1")
    assert missing.code == ExitCode.USAGE
