"""What a workspace observation covers (#26 item 9): a code agent that runs its tests in a
``ctx.step`` leaves caches in the workspace (``__pycache__``, ``.pytest_cache``,
``node_modules/.cache``) and files its ``.gitignore`` ignores. A resume after a crash
there must go on, as a run that never crashed does, instead of freezing for environment
drift; anything else a step leaves is still a change (the safe direction)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

TEST_FILE = "from m import x\n\n\ndef test_x():\n    assert x == 1\n"


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(
        ["git", "-c", "user.name=h", "-c", "user.email=h@localhost", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def run_tests(root: Path) -> int:
    """The agent's check: a real pytest in the workspace (it leaves __pycache__ and
    .pytest_cache behind)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a developer's shell would: caches made
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly"],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    return done.returncode


def agent(ws: cp.Workspace, check: Callable[[Path], Any]) -> cp.Workflow[str]:
    @cp.workflow("agent", version="1")
    def flow(ctx: cp.Context) -> str:
        ctx.act("code", ws, op="write", path="m.py", content="x = 1\n")
        ctx.act("test", ws, op="write", path="test_m.py", content=TEST_FILE)
        ctx.step("check", check, str(ws.root))
        ctx.act("notes", ws, op="write", path="NOTES.md", content="checked\n")
        return "done"

    return flow


def crash_then_resume(tmp_path: Path, flow: cp.Workflow[str]) -> str:
    """Crash right after the check step committed, then resume in a new ledger."""
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    points = cp.CrashPoints(match="after_commit[step_done:check]")
    with pytest.raises(cp.SimulatedCrash), cp.Ledger(db, crash_points=points) as first:
        first.run(flow, run_id="r")
    with cp.Ledger(db) as second:
        second.register(flow)
        result: str = second.resume("r")
        return result


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def test_a_test_run_s_caches_do_not_freeze_the_resume(tmp_path: Path, root: Path) -> None:
    ws = cp.Workspace(root)
    assert crash_then_resume(tmp_path, agent(ws, lambda r: run_tests(Path(r)))) == "done"
    assert (root / "__pycache__").is_dir()  # the caches are there, left out of the scope
    assert (root / ".pytest_cache").is_dir()
    assert (root / "NOTES.md").read_text() == "checked\n"
    assert ws.observed_files() == ["NOTES.md", "m.py", "test_m.py"]


def node_cache(root: str) -> None:
    cache = Path(root) / "node_modules" / ".cache" / "babel-loader"
    cache.mkdir(parents=True)
    (cache / "0f3a.json").write_text("{}")
    (Path(root) / ".coverage").write_bytes(b"coverage data")


def test_node_and_coverage_caches_are_left_out(tmp_path: Path, root: Path) -> None:
    assert crash_then_resume(tmp_path, agent(cp.Workspace(root), node_cache)) == "done"


def git_ignored_output(root: str) -> None:
    (Path(root) / "build").mkdir()
    (Path(root) / "build" / "app.o").write_bytes(b"\x7fELF")
    (Path(root) / "debug.log").write_text("a log line\n")


@pytest.fixture
def repo(root: Path) -> Path:
    _git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "kept.log").write_text("tracked although ignored\n")
    _git(root, "add", ".gitignore")
    _git(root, "add", "-f", "kept.log")
    _git(root, "commit", "-q", "-m", "init")
    return root


def test_files_git_ignores_do_not_freeze_the_resume(tmp_path: Path, repo: Path) -> None:
    ws = cp.Workspace(repo)
    assert crash_then_resume(tmp_path, agent(ws, git_ignored_output)) == "done"
    seen = ws.observe()
    assert seen.details is not None
    assert seen.details["scope"]["gitignore"] == "applied"
    assert seen.details["scope"]["left_out"] == 2  # build/ (pruned whole) and debug.log
    assert "build/app.o" not in ws.observed_files()
    assert "kept.log" in ws.observed_files()  # tracked: git's rules do not apply to it


@pytest.mark.parametrize(
    "edit",
    [
        lambda root: (Path(root) / "kept.log").write_text("changed\n"),  # tracked, matched
        lambda root: (Path(root) / "stray.txt").write_text("not ignored\n"),
    ],
    ids=["tracked-file-matching-a-pattern", "untracked-file-not-ignored"],
)
def test_what_git_does_not_ignore_is_still_a_change(
    tmp_path: Path, repo: Path, edit: Callable[[str], Any]
) -> None:
    with pytest.raises(cp.RunFrozen) as frozen:
        crash_then_resume(tmp_path, agent(cp.Workspace(repo), edit))
    assert isinstance(frozen.value.cause, cp.EnvironmentChanged)
    assert not (repo / "NOTES.md").exists()


def test_observe_all_observes_the_caches_too(tmp_path: Path, root: Path) -> None:
    ws = cp.Workspace(root, observe_all=True)
    with pytest.raises(cp.RunFrozen) as frozen:
        crash_then_resume(tmp_path, agent(ws, node_cache))
    assert isinstance(frozen.value.cause, cp.EnvironmentChanged)
    details = ws.observe().details
    assert details is not None
    assert details["scope"]["gitignore"] == "not applied (observe_all)"


def test_a_workspace_git_ignores_as_a_whole_keeps_every_file(tmp_path: Path) -> None:
    """A workspace inside an ignored directory of a repository (a scratch dir): git's
    rules would leave nothing to observe, so they are not applied."""
    outer = tmp_path / "outer"
    outer.mkdir()
    _git(outer, "init", "-q", "-b", "main")
    (outer / ".gitignore").write_text("scratch/\n")
    inner = outer / "scratch" / "ws"
    inner.mkdir(parents=True)
    (inner / "a.txt").write_text("a\n")
    ws = cp.Workspace(inner)
    assert ws.observed_files() == ["a.txt"]
    details = ws.observe().details
    assert details is not None
    assert details["scope"]["gitignore"] == "not applied: git ignores the workspace itself"
    assert "git-ignored files" not in details["scope"]["excluded"]


def test_a_write_into_an_ignored_path_expects_no_change(tmp_path: Path, repo: Path) -> None:
    """The act's expected fingerprint follows the same scope: a write git ignores leaves
    the observation as it was, so a crash right after it reconciles as usual."""
    ws = cp.Workspace(repo)

    @cp.workflow("ignored-write", version="1")
    def flow(ctx: cp.Context) -> str:
        ctx.act("log", ws, op="write", path="build/out.txt", content="x\n")
        ctx.act("notes", ws, op="write", path="NOTES.md", content="n\n")
        return "done"

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    points = cp.CrashPoints(match="inside[act:log:renamed]")
    with pytest.raises(cp.SimulatedCrash), cp.Ledger(db, crash_points=points) as first:
        first.run(flow, run_id="r")
    with cp.Ledger(db) as second:
        second.register(flow)
        assert second.resume("r") == "done"
    assert (repo / "build" / "out.txt").read_text() == "x\n"


def test_git_is_asked_again_whenever_its_answer_could_change(repo: Path) -> None:
    """The memo of git's answer (an append costs no subprocess) never hides a change of
    git's rules or of the tree."""
    ws = cp.Workspace(repo)
    (repo / "a.tmpx").write_text("a\n")
    (repo / "logs").mkdir()
    (repo / "logs" / "only.log").write_text("x\n")  # git collapses logs/ as ignored
    assert ws.observed_files() == [".gitignore", "a.tmpx", "kept.log"]
    (repo / "a.tmpx").write_text("changed, same paths\n")
    assert ws.observed_files() == [".gitignore", "a.tmpx", "kept.log"]
    with (repo / ".gitignore").open("a") as f:  # a rule changes, the paths do not
        f.write("*.tmpx\n")
    assert ws.observed_files() == [".gitignore", "kept.log"]
    (repo / "logs" / "notes.txt").write_text("not ignored\n")  # inside the collapsed dir
    assert ws.observed_files() == [".gitignore", "kept.log", "logs/notes.txt"]
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("logs/\n")  # outside the tree
    assert ws.observed_files() == [".gitignore", "kept.log"]
    _git(repo, "add", "-f", "a.tmpx")  # tracked now: covered although a pattern matches
    assert ws.observed_files() == [".gitignore", "a.tmpx", "kept.log"]
