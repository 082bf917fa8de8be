"""crashproof fork: a new run from another's prefix up to and including a step. Its acts
replay with their receipts and operation ids (nothing executed again at the target);
later acts run live once, under operation ids of the new run; refused inside an act."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.cli import ExitCode
from crashproof.journal.records import EventType

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

CHAIN = """
import pathlib

import crashproof as cp

EFFECTS = pathlib.Path("effects.log")  # the real target: every executed act appends


class Stamp(cp.Tool):
    name = "stamp"
    version = "1"
    supports_lookup = False
    reread_receipts = False

    def execute(self, call):
        with EFFECTS.open("a", encoding="utf-8") as f:
            f.write(call.operation_id + "\\n")
        return cp.Receipt(f"r-{call.operation_id}", {"op": call.operation_id})


stamp = Stamp()


@cp.workflow("chain", version="1")
def chain(ctx):
    one = ctx.act("one", stamp, n=1)
    two = ctx.act("two", stamp, n=2)
    three = ctx.act("three", stamp, n=3)
    return [one["op"], two["op"], three["op"]]
"""


def _effects(project: Path) -> list[str]:
    log = project / "effects.log"
    return log.read_text(encoding="utf-8").split() if log.exists() else []


def test_fork_replays_the_prefix_and_runs_the_rest_live(project: Path, cli: Cli) -> None:
    (project / "chain.py").write_text(CHAIN, encoding="utf-8")
    ran = cli("run", "chain:chain", "--run-id", "c:1", "--json")
    assert ran.code == ExitCode.OK, ran.err
    assert ran.json()["result"] == ["c:1/one", "c:1/two", "c:1/three"]
    assert _effects(project) == ["c:1/one", "c:1/two", "c:1/three"]

    forked = cli("fork", "c:1", "--from", "two", "--run-id", "c:2", "--by", "erin", "--json")
    assert forked.code == ExitCode.OK, forked.err
    assert (forked.json()["from_run"], forked.json()["from_step"]) == ("c:1", "two")
    resumed = cli("resume", "c:2", "--app", "chain", "--json")
    assert resumed.code == ExitCode.OK, resumed.err
    # one and two replayed with the source's receipts and operation ids; three ran live
    assert resumed.json()["result"] == ["c:1/one", "c:1/two", "c:2/three"]
    assert _effects(project) == ["c:1/one", "c:1/two", "c:1/three", "c:2/three"]
    again = cli("resume", "c:2", "--app", "chain")
    assert again.code == ExitCode.OK
    assert len(_effects(project)) == 4  # once

    with cp.Ledger(f"sqlite:///{project / 'crashproof.db'}") as ledger:
        events = ledger.journal("c:2")
    forks = [e for e in events if e.type is EventType.RUN_FORKED]
    assert len(forks) == 1
    assert forks[0].payload["by"] == "erin"
    assert all(e.run_id == "c:2" for e in events)
    checked = cli("check", "c:2")
    assert checked.code == ExitCode.OK, checked.out + checked.err
    assert cli("check").code == ExitCode.OK
    audit = cli("show", "c:2", "--timeline").out
    assert "forked from run 'c:1' at step 'two'" in audit


def test_fork_refusals_write_nothing(project: Path, cli: Cli) -> None:
    (project / "chain.py").write_text(CHAIN, encoding="utf-8")
    assert cli("run", "chain:chain", "--run-id", "c:1").code == ExitCode.OK
    unknown_step = cli("fork", "c:1", "--from", "nope", "--run-id", "c:2")
    assert unknown_step.code == ExitCode.CONFLICT
    assert "no completed step 'nope'" in unknown_step.err
    taken = cli("fork", "c:1", "--from", "one", "--run-id", "c:1")
    assert taken.code == ExitCode.CONFLICT
    assert cli("show", "c:2").code == ExitCode.USAGE  # never created
    missing = cli("fork", "nope:1", "--from", "one", "--run-id", "c:3")
    assert missing.code == ExitCode.USAGE
    # A NUL: no run id any store can keep (PostgreSQL's text refuses it), so none here.
    nul = cli("fork", "c:1", "--from", "one", "--run-id", "c\x004")
    assert nul.code == ExitCode.CONFLICT
    assert "is not a usable run id" in nul.err
    with cp.Ledger(f"sqlite:///{project / 'crashproof.db'}") as ledger:
        assert [row.run_id for row in ledger.runs()] == ["c:1"]


def test_fork_lists_the_acts_that_will_run_again(project: Path, cli: Cli) -> None:
    (project / "chain.py").write_text(CHAIN, encoding="utf-8")
    assert cli("run", "chain:chain", "--run-id", "c:1").code == ExitCode.OK
    dry = cli("fork", "c:1", "--from", "one", "--run-id", "c:2", "--dry-run", "--json")
    assert dry.code == ExitCode.OK, dry.err
    assert [(a["step"], a["tool"], a["operation_id"]) for a in dry.json()["run_again"]] == [
        ("two", "stamp", "c:1/two"),
        ("three", "stamp", "c:1/three"),
    ]
    assert cli("show", "c:2").code == ExitCode.USAGE  # a dry run forks nothing
    text = cli("fork", "c:1", "--from", "two", "--run-id", "c:2", "--dry-run")
    assert "a fork would run again 1 act(s)" in text.err
    assert "three  tool stamp, was c:1/three (succeeded)" in text.err
    assert cli("show", "c:2").code == ExitCode.USAGE
    forked = cli("fork", "c:1", "--from", "two", "--run-id", "c:2")
    assert forked.code == ExitCode.OK
    assert "the fork will run again 1 act(s)" in forked.err
    last = cli("fork", "c:1", "--from", "three", "--run-id", "c:3", "--dry-run")
    assert "no act" in last.err
    refused = cli("fork", "c:1", "--from", "nope", "--run-id", "c:4", "--dry-run")
    assert refused.code == ExitCode.CONFLICT
