"""resume --raise-budget / --rebind-policy: a run stopped at a budget exits 6 (stopped,
resumable) until an operator raises the limit; the raise and any re-bind are journaled
with who made them."""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import ExitCode
from crashproof.journal.records import EventType

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result
Calls = Callable[[], list[str]]

BUDGETED = """
import pathlib

import crashproof as cp

POLICY = cp.Policy("p1", allow={})
POLICY_2 = cp.Policy("p2", allow={}, identity="ops-bot")


def ask(i):
    with pathlib.Path("calls.log").open("a", encoding="utf-8") as f:
        f.write(f"ask{i}\\n")
    return cp.Decision(i, model="m", usage={"total_tokens": 60}, cost=0.01)


@cp.workflow("spend", version="1")
def spend(ctx):
    return [ctx.decide(f"ask{i}", ask, i) for i in range(3)]
"""


@pytest.fixture
def budgeted(project: Path) -> Iterator[Any]:
    """The user's module, imported, with a run stopped by its token budget (100)."""
    (project / "budgeted.py").write_text(BUDGETED, encoding="utf-8")
    sys.path.insert(0, str(project))  # the project fixture restores sys.path
    module = importlib.import_module("budgeted")
    with cp.Ledger("sqlite:///crashproof.db") as ledger:
        options = cp.RunOptions(limits=cp.Limits(max_tokens=100), policy=module.POLICY)
        with pytest.raises(cp.RunStopped):
            ledger.run(module.spend, run_id="s:1", options=options)
    del ledger, options  # what a new process would not hold
    yield module
    sys.modules.pop("budgeted", None)


def events(run_id: str) -> list[Any]:
    with cp.Ledger("sqlite:///crashproof.db") as ledger:
        return ledger._store.load_events(run_id)


def test_a_stopped_run_exits_6_until_its_budget_is_raised(
    budgeted: Any, cli: Cli, calls: Calls
) -> None:
    assert calls() == ["ask0", "ask1"]
    stopped = cli("resume", "s:1", "--app", "budgeted")
    assert stopped.code == ExitCode.RUN_INTERRUPTED
    first, hint = stopped.err.splitlines()
    assert first.startswith("crashproof: error: run 's:1' stopped: budget:tokens")
    assert "120 of 100 tokens used" in first
    assert "--raise-budget tokens=N" in first
    assert hint.startswith("hint: ")
    assert calls() == ["ask0", "ask1"]

    shown = cli("show", "s:1", "--json").json()
    assert (shown["status"], shown["reason"]) == ("stopped", "budget:tokens")
    assert shown["limits"]["tokens"] == 100
    assert shown["policy"]["version"] == "p1"
    listed = cli("runs", "--status", "stopped", "--json").json()
    assert [run["run_id"] for run in listed] == ["s:1"]
    as_json = cli("resume", "s:1", "--app", "budgeted", "--json")
    assert as_json.code == ExitCode.RUN_INTERRUPTED
    assert as_json.json()["status"] == "stopped"

    resumed = cli(
        "resume", "s:1", "--app", "budgeted", "--raise-budget", "tokens=5000", "--by", "erin"
    )
    assert resumed.code == ExitCode.OK, resumed.err
    assert resumed.out.split() == ["[", "0,", "1,", "2", "]"]
    assert calls() == ["ask0", "ask1", "ask2"]  # each decision asked exactly once
    raised = [e for e in events("s:1") if e.type is EventType.BUDGET_RAISED]
    assert len(raised) == 1
    assert raised[0].payload["by"] == "erin"
    assert raised[0].payload["changed"] == {"tokens": [100, 5000]}
    shown = cli("show", "s:1", "--json").json()
    assert (shown["status"], shown["limits"]["tokens"]) == ("succeeded", 5000)


def test_bad_raises_are_usage_errors_and_change_nothing(
    budgeted: Any, cli: Cli, calls: Calls
) -> None:
    before = len(events("s:1"))
    for bad in ("tokens=lots", "minutes=5", "tokens"):
        result = cli("resume", "s:1", "--app", "budgeted", "--raise-budget", bad)
        assert result.code == ExitCode.USAGE, (bad, result.err)
        assert result.err.splitlines()[1].startswith("hint: e.g. --raise-budget tokens=5000")
    lowered = cli("resume", "s:1", "--app", "budgeted", "--raise-budget", "tokens=50")
    assert lowered.code == ExitCode.USAGE
    assert "would lower the limit (now 100)" in lowered.err
    nobody = cli("resume", "s:1", "--app", "budgeted", "--raise-budget", "tokens=500", "--by", "")
    assert nobody.code == ExitCode.USAGE
    assert "by= must name who" in nobody.err
    assert len(events("s:1")) == before
    assert calls() == ["ask0", "ask1"]


def test_rebind_policy_picks_the_version_from_the_app_and_is_journaled(
    budgeted: Any, cli: Cli, calls: Calls
) -> None:
    unknown = cli("resume", "s:1", "--app", "budgeted", "--rebind-policy", "p9")
    assert unknown.code == ExitCode.USAGE
    assert "no cp.Policy with version 'p9' in the --app modules (found: p1, p2)" in unknown.err
    resumed = cli(
        "resume",
        "s:1",
        "--app",
        "budgeted",
        "--rebind-policy",
        "p2",
        "--raise-budget",
        "tokens=none",
        "--by",
        "frank",
    )
    assert resumed.code == ExitCode.OK, resumed.err
    rebound = [e for e in events("s:1") if e.type is EventType.POLICY_REBOUND]
    assert len(rebound) == 1
    payload = rebound[0].payload
    assert (payload["by"], payload["old"]["version"], payload["new"]["version"]) == (
        "frank",
        "p1",
        "p2",
    )
    assert cli("show", "s:1", "--json").json()["policy"]["identity"] == "ops-bot"


def test_a_run_bound_to_a_policy_the_app_lacks_is_refused(
    budgeted: Any, cli: Cli, project: Path, calls: Calls
) -> None:
    (project / "budgeted.py").write_text(
        BUDGETED.replace('cp.Policy("p1"', 'cp.Policy("p3"'), encoding="utf-8"
    )
    sys.modules.pop("budgeted", None)
    # As in a new process: the old module's policy p1 is no longer alive anywhere.
    vars(budgeted).pop("POLICY")
    gc.collect()
    refused = cli("resume", "s:1", "--app", "budgeted", "--raise-budget", "tokens=5000")
    assert refused.code == ExitCode.RUN_INTERRUPTED
    assert "PolicyMismatch: run 's:1' is bound to policy 'p1'" in refused.err
    assert "offers policy p2, p3" in refused.err
    assert not [e for e in events("s:1") if e.type is EventType.BUDGET_RAISED]
    assert calls() == ["ask0", "ask1"]


GUARDED = """
import pathlib

import crashproof as cp

WS = cp.Workspace(pathlib.Path("ws"))
POLICY = cp.Policy("ws-1", allow={"workspace": "1"}, scopes={"workspace": {"path": "src/*"}})


@cp.workflow("guarded", version="1")
def guarded(ctx):
    ctx.act("ok", WS, op="write", path="src/a.txt", content="a")
    try:
        ctx.act("sneak", WS, op="write", path="secrets.txt", content="leak")
    except cp.PolicyViolation:
        return "refused"
    return "leaked"
"""


def test_show_displays_a_policy_refusal(project: Path, cli: Cli) -> None:
    (project / "guarded.py").write_text(GUARDED, encoding="utf-8")
    (project / "ws" / "src").mkdir(parents=True)
    sys.path.insert(0, str(project))
    module = importlib.import_module("guarded")
    try:
        with cp.Ledger("sqlite:///crashproof.db") as ledger:
            options = cp.RunOptions(policy=module.POLICY)
            assert ledger.run(module.guarded, run_id="g:1", options=options) == "refused"
    finally:
        sys.modules.pop("guarded", None)
    assert not (project / "ws" / "secrets.txt").exists()
    shown = cli("show", "g:1")
    assert shown.code == ExitCode.OK, shown.err
    row = next(line for line in shown.out.splitlines() if line.strip().startswith("sneak"))
    assert "failed" in row
    assert "PolicyViolation: act 'sneak' refused by policy" in row
    step = cli("show", "g:1", "--json").json()["steps"][1]
    assert (step["status"], step["failure"]) == ("failed", "policy")
    assert "path 'secrets.txt' is outside the workspace scope ['src/*']" in step["error"]["message"]
