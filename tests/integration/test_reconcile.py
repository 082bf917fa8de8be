"""Reconciliation: every recorded receipt compared with the tool's own lookup."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.tools.git import GitTool
from integration._targets import BlindTool, Target, TargetTool


class ObservedTarget(TargetTool):
    """A target that observes an instance but names none without observing: it keeps
    the name-only match (``Tool.observed_instance`` left as None)."""

    def observe(self) -> cp.Observation:
        return cp.Observation(f"target:{self.target.path}", "state")


def test_workspace_acts_confirmed_superseded_and_drifted(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    ws = cp.Workspace(tmp_path / "ws")

    @cp.workflow("edits", version="1")
    def edits(ctx: cp.Context) -> None:
        ctx.act("a1", ws, op="append", path="a.txt", text="one\n")
        ctx.act("a2", ws, op="append", path="a.txt", text="two\n")
        ctx.act("b", ws, op="write", path="b.txt", content="bee\n")

    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.run(edits, run_id="r")
    checks = {c.step: c for c in ledger.reconcile("r", [ws])}
    assert {k: c.status for k, c in checks.items()} == {
        "a1": "confirmed",
        "a2": "confirmed",
        "b": "confirmed",
    }
    assert "superseded by 'a2'" in checks["a1"].detail
    (tmp_path / "ws" / "b.txt").write_text("someone else\n")
    checks = {c.step: c for c in ledger.reconcile("r", [ws])}
    assert checks["b"].status == "drifted"
    assert checks["a2"].status == "confirmed"
    assert checks["b"].operation_id == "r/b"


def test_receipts_against_a_target(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    tool, blind = TargetTool(target), BlindTool(target)

    @cp.workflow("two", version="1")
    def two(ctx: cp.Context) -> None:
        ctx.act("one", tool, n=1)
        ctx.act("two", tool, n=2)
        ctx.act("three", blind, n=3)

    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.run(two, run_id="r")
    assert [c.status for c in ledger.reconcile("r", [tool, blind])] == [
        "confirmed",
        "confirmed",
        "needs_review",  # no lookup: nobody can tell
    ]
    state = target.state()
    del state["records"]["r/one"]  # deleted behind our back
    state["records"]["r/two"]["id"] = "rec-other"  # replaced behind our back
    target.save(state)
    checks = ledger.reconcile("r", [tool])
    assert [c.status for c in checks] == ["drifted", "drifted", "needs_review"]
    assert "no longer holds" in checks[0].detail
    assert "rec-other" in checks[1].detail
    assert "not available here" in checks[2].detail
    assert json.dumps([c.to_json() for c in checks])  # JSON-ready for the CLI
    with pytest.raises(cp.RunNotFound):
        ledger.reconcile("nope", [tool])


@pytest.mark.parametrize("changed", [True, False])
def test_two_workspaces_writing_the_same_relative_path_are_two_targets(
    tmp_path: Path, changed: bool
) -> None:
    """Every workspace is the tool ``workspace``: its targets name the root too, else a
    write to b/out.txt superseded one to a/out.txt, whose receipt a resume then never
    read again (out.txt is left out of the observation, as an ignored file is: the
    re-read is all that guards it) and the run went on over a file someone changed."""
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
    ws_a, ws_b = (cp.Workspace(root, observe_ignore=["out.txt"]) for root in roots)

    @cp.workflow("two-roots", version="1")
    def two_roots(ctx: cp.Context) -> None:
        ctx.act("a", ws_a, op="write", path="out.txt", content="from a\n")
        ctx.act("b", ws_b, op="write", path="out.txt", content="from b\n")
        ctx.act("after", ws_b, op="write", path="z.txt", content="z\n")

    url = f"sqlite:///{tmp_path / 'l.db'}"
    crash = cp.CrashPoints(match="after_commit[step_done:b]")
    with cp.Ledger(url, crash_points=crash) as ledger, pytest.raises(cp.SimulatedCrash):
        ledger.run(two_roots, run_id="r")
    if not changed:  # both receipts hold: the run goes on
        with cp.Ledger(url) as ledger:
            ledger.run(two_roots, run_id="r")
        assert [(root / "out.txt").read_text() for root in roots] == ["from a\n", "from b\n"]
        assert (roots[1] / "z.txt").read_text() == "z\n"
        return
    (roots[0] / "out.txt").write_text("someone else\n")
    with cp.Ledger(url) as ledger:
        with pytest.raises(cp.RunFrozen, match="no longer match") as frozen:
            ledger.run(two_roots, run_id="r")
        (check,) = (frozen.value.evidence or {})["receipts"]
        assert (check["step"], check["status"]) == ("a", "drifted")
    assert not (roots[1] / "z.txt").exists()  # nothing ran past the drift


@pytest.mark.parametrize("crashed", [True, False])
def test_reconcile_matches_each_workspace_act_to_its_own_root(
    tmp_path: Path, crashed: bool
) -> None:
    """Every workspace is the tool ``workspace``: reconciliation picks, per act, the given
    tool of the instance the act recorded (its root), else an act on a/ was looked up
    under b/ (b/out.txt holds b's bytes: drifted) and the operator read a drift that is
    not there. A root not given is not available, never checked against another."""
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
    ws_a, ws_b = (cp.Workspace(root) for root in roots)

    @cp.workflow("both-roots", version="1")
    def both_roots(ctx: cp.Context) -> None:
        ctx.act("a", ws_a, op="write", path="out.txt", content="from a\n")
        ctx.act("b", ws_b, op="write", path="out.txt", content="from b\n")

    url = f"sqlite:///{tmp_path / 'l.db'}"
    crash = cp.CrashPoints(match="after_commit[step_done:b]") if crashed else None
    with cp.Ledger(url, crash_points=crash) as ledger:
        if crashed:
            with pytest.raises(cp.SimulatedCrash):
                ledger.run(both_roots, run_id="r")
        else:
            ledger.run(both_roots, run_id="r")
    # The operator's process: its own tool objects, in any order.
    with cp.Ledger(url) as ledger:
        for given in ([ws_a, ws_b], [cp.Workspace(roots[1]), cp.Workspace(roots[0])]):
            checks = {c.step: c for c in ledger.reconcile("r", given)}
            assert {k: c.status for k, c in checks.items()} == {
                "a": "confirmed",
                "b": "confirmed",
            }
        for only, other in ((ws_a, "b"), (ws_b, "a")):
            checks = {c.step: c for c in ledger.reconcile("r", [only])}
            mine = "a" if other == "b" else "b"
            assert checks[mine].status == "confirmed"
            assert checks[other].status == "needs_review"
            assert "'workspace' is not available here" in checks[other].detail
            assert str(tmp_path / other) in checks[other].detail
        (roots[0] / "out.txt").write_text("someone else\n")
        checks = {c.step: c for c in ledger.reconcile("r", [ws_b, ws_a])}
        assert (checks["a"].status, checks["b"].status) == ("drifted", "confirmed")


def test_a_tool_that_names_no_instance_is_matched_by_name(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")

    @cp.workflow("one", version="1")
    def one(ctx: cp.Context) -> None:
        ctx.act("one", ObservedTarget(target), n=1)

    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.run(one, run_id="r")
    (intent,) = [e for e in ledger.journal("r") if e.type.value == "act_intent"]
    assert intent.payload["observed"]["before"]["instance"].startswith("target:")
    other = ObservedTarget(Target(tmp_path / "t.json"))  # the operator's own object
    assert [c.status for c in ledger.reconcile("r", [other])] == ["confirmed"]


def _git(cwd: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)
    return done.stdout.decode().strip()


@pytest.mark.parametrize("first_commit", [False, True])
def test_reconcile_matches_each_git_act_to_its_own_repository(
    tmp_path: Path, first_commit: bool
) -> None:
    """Every GitTool is the tool ``git``: a commit in a/ was looked up in b/ (not there:
    drifted). ``first_commit``: the act gives its repository a root commit, so the
    instance it left (its receipt's) is the one the tool names now, not the one its
    intent saw (``#none``)."""
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
        _git(root, "init", "-q", "-b", "main")
        if not first_commit:
            (root / "README.md").write_text("hello\n")
            _git(root, "add", "README.md")
            _git(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init")
        (root / "out.txt").write_text(f"from {root.name}\n")
    git_a, git_b = (GitTool(root) for root in roots)

    @cp.workflow("both-repos", version="1")
    def both_repos(ctx: cp.Context) -> None:
        ctx.act("a", git_a, op="commit", message="out", paths=["out.txt"])
        ctx.act("b", git_b, op="commit", message="out", paths=["out.txt"])

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        ledger.run(both_repos, run_id="r")
        checks = ledger.reconcile("r", [GitTool(roots[1]), GitTool(roots[0])])
        assert [(c.step, c.status) for c in checks] == [("a", "confirmed"), ("b", "confirmed")]
        checks = ledger.reconcile("r", [git_b])
        assert [(c.step, c.status) for c in checks] == [("a", "needs_review"), ("b", "confirmed")]
        assert "'git' is not available here (the act ran on git:" in checks[0].detail


def test_an_act_in_flight_on_another_root_supersedes_nothing_here(tmp_path: Path) -> None:
    """b's write is in flight (the crash came before its receipt): it is the last act on
    b/out.txt, never on a/out.txt. Matched by name alone, the one workspace given (a/)
    took it, a was reported superseded by b and its changed file went unseen."""
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
    ws_a, ws_b = (cp.Workspace(root) for root in roots)

    @cp.workflow("in-flight", version="1")
    def in_flight(ctx: cp.Context) -> None:
        ctx.act("a", ws_a, op="write", path="out.txt", content="from a\n")
        ctx.act("b", ws_b, op="write", path="out.txt", content="from b\n")

    url = f"sqlite:///{tmp_path / 'l.db'}"
    crash = cp.CrashPoints(match="inside[act:b:renamed]")
    with cp.Ledger(url, crash_points=crash) as ledger, pytest.raises(cp.SimulatedCrash):
        ledger.run(in_flight, run_id="r")
    (roots[0] / "out.txt").write_text("someone else\n")
    with cp.Ledger(url) as ledger:
        (check,) = ledger.reconcile("r", [cp.Workspace(roots[0])])
        assert (check.step, check.status) == ("a", "drifted"), check.detail
        (check,) = ledger.reconcile("r", [ws_b, ws_a])
        assert (check.step, check.status) == ("a", "drifted"), check.detail
