"""The git tool on a real repository and a real (local, bare) remote: commit, branch and
push as acts, recovered after SIGKILL at every window of the act protocol with exactly one
commit per operation id, plus receipt conflicts, drift and refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.tools.git import GitTool

from .git_child import RUN_ID, flow

CHILD = Path(__file__).parent / "git_child.py"
OP = f"{RUN_ID}/commit"
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}

pytestmark = pytest.mark.timeout(60)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()


@dataclass
class Setup:
    root: Path
    repo: Path
    remote: Path
    opened: list[cp.Ledger] = field(default_factory=list)

    @property
    def db(self) -> Path:
        return self.root / "l.db"

    def ledger(self, **kwargs: Any) -> cp.Ledger:
        """A new Ledger object, as a restarted process would have (closed at teardown)."""
        ledger = cp.Ledger(f"sqlite:///{self.db}", **kwargs)
        self.opened.append(ledger)
        return ledger

    def close(self) -> None:
        for ledger in self.opened:
            ledger.close()

    def run(self, **kwargs: Any) -> dict[str, Any]:
        return self.ledger(**kwargs).run(flow, run_id=RUN_ID, repo=str(self.repo))

    def spawn(self, point: str) -> int:
        argv = [sys.executable, str(CHILD), str(self.db), str(self.repo), point]
        return subprocess.run(argv, check=False, timeout=30).returncode

    def count(self, rev: str = "main") -> int:
        return int(git(self.repo, "rev-list", "--count", rev))

    def op_commits(self, op: str = OP) -> list[str]:
        """The commits of main whose operation trailer is ``op``."""
        out = git(
            self.repo,
            "log",
            "--format=%H %(trailers:key=Crashproof-Operation,valueonly,separator=%x2c)",
            "main",
        )
        return [line.split(" ", 1)[0] for line in out.splitlines() if line.endswith(f" {op}")]

    def remote_sha(self, branch: str = "feature") -> str | None:
        out = git(self.remote, "for-each-ref", "--format=%(objectname)", f"refs/heads/{branch}")
        return out or None

    def fingerprint(self) -> str:
        return cp.Workspace(self.repo).fingerprint()


def make_setup(root: Path) -> Setup:
    repo, remote = root / "repo", root / "remote.git"
    remote.mkdir()
    git(remote, "init", "-q", "--bare", "-b", "main")
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Test")
    git(repo, "config", "user.email", "test@example.com")
    (repo / "README.md").write_text("hello\n")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "README.md", ".gitignore")
    git(repo, "commit", "-q", "-m", "initial")
    git(repo, "remote", "add", "origin", str(remote))
    return Setup(root, repo, remote)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = make_setup(tmp_path)
    yield s
    s.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The workspace fingerprint of an uninterrupted run."""
    s = make_setup(tmp_path_factory.mktemp("git-ref"))
    s.run()
    s.close()
    return s.fingerprint()


def count_git_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []
    original: Callable[..., Any] = GitTool._run

    def counting(self: GitTool, *args: str, **kwargs: Any) -> Any:
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GitTool, "_run", counting)
    return calls


def check_done(s: Setup, result: dict[str, Any], reference: str) -> None:
    """The end state of a complete run: one commit for the operation, pushed, clean."""
    head = git(s.repo, "rev-parse", "main")
    assert s.op_commits() == [head]
    assert s.count() == 2
    assert result["commit"] == {"sha": head, "branch": "main"}
    assert result["branch"] == {"branch": "feature", "sha": head}
    assert result["push"] == {"remote": "origin", "branch": "feature", "sha": head}
    assert git(s.repo, "rev-parse", "refs/heads/feature") == head
    assert s.remote_sha() == head
    assert git(s.repo, "status", "--porcelain") == ""  # index and worktree match the commit
    assert s.fingerprint() == reference


def test_happy_path_and_replay(
    setup: Setup, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = setup.run()
    check_done(setup, result, reference)
    head = result["commit"]["sha"]
    assert git(setup.repo, "log", "-1", "--format=%s", head) == "Add a and b"
    assert git(setup.repo, "show", "--format=", "--name-only", head).split() == [
        "a.txt",
        "notes/b.txt",
    ]
    info = setup.ledger().get_run(RUN_ID)
    commit_step = next(s for s in info.steps if s.key == "commit")
    assert commit_step.operation_id == OP
    trailers = git(setup.repo, "log", "-1", "--format=%(trailers:only)", head).splitlines()
    assert trailers == [
        f"Crashproof-Operation: {OP}",
        f"Crashproof-Intent: {commit_step.intent_digest}",
    ]
    # A re-run (a new process, a new Ledger) replays: git is never called, nothing changes.
    calls = count_git_calls(monkeypatch)
    assert setup.run() == result
    assert calls == []
    assert setup.count() == 2


CRASHES = [
    "before_commit[act_intent:commit]",  # no intent: the step is reached afresh
    "after_commit[act_intent:commit]",  # intent, nothing done: lookup None, execute once
    "inside[act:commit:staged]",  # the index holds the staged files, no commit
    "before_commit[step_done:commit]",  # the branch moved, no receipt: lookup finds it
    "after_commit[act_intent:branch]",
    "before_commit[step_done:branch]",
    "before_commit[act_intent:push]",
    "after_commit[act_intent:push]",
    "inside[act:push:pushed]",  # the remote moved, no receipt: ls-remote finds it
    "before_commit[step_done:push]",
    "before_commit[run_succeeded]",  # every act recorded: resume calls git not once
]


GIT_READS = {"rev-parse", "log", "cat-file", "for-each-ref", "ls-remote"}


@pytest.mark.parametrize("point", CRASHES)
def test_sigkill_then_resume(
    point: str, setup: Setup, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert setup.spawn(point) == -signal.SIGKILL
    calls = count_git_calls(monkeypatch)
    result = setup.run()  # a new Ledger in this process
    check_done(setup, result, reference)
    assert setup.ledger().get_run(RUN_ID).status is cp.RunStatus.SUCCEEDED
    commits = [c for c in calls if c[0] == "commit-tree"]
    pushes = [c for c in calls if c[0] == "push"]
    if point == "before_commit[run_succeeded]":
        # Nothing is redone; the completed acts' receipts are only read again (lookups:
        # rev-parse, log), never written.
        assert {c[0] for c in calls} <= GIT_READS
    if "push" in point or "branch" in point or "run_succeeded" in point:
        assert commits == []  # the commit was recorded before the crash: not redone
    if "step_done:push" in point or "push:pushed" in point or "run_succeeded" in point:
        assert pushes == []  # the push happened before the crash: looked up, not redone


@pytest.mark.parametrize("crash", [None, "after_commit[act_intent:commit]"])
def test_receipt_conflict_freezes(setup: Setup, crash: str | None) -> None:
    message = f"manual\n\nCrashproof-Operation: {OP}\nCrashproof-Intent: deadbeef"
    git(setup.repo, "commit", "-q", "--allow-empty", "-m", message)
    manual = git(setup.repo, "rev-parse", "HEAD")
    if crash is not None:
        assert setup.spawn(crash) == -signal.SIGKILL
    with pytest.raises(cp.RunFrozen) as frozen:
        setup.run()
    assert frozen.value.status == "needs_review"
    assert isinstance(frozen.value.cause, cp.ReceiptConflict)
    info = setup.ledger().get_run(RUN_ID)
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    digest = next(s for s in info.steps if s.key == "commit").intent_digest
    assert digest is not None
    evidence = info.evidence or {}
    assert evidence["intent_digest"] == digest
    assert evidence["receipt"]["intent_digest"] == "deadbeef"
    assert evidence["receipt"]["receipt_id"] == manual
    assert "deadbeef" in (info.reason or "")
    assert digest in (info.reason or "")
    # No new commit; the run stays frozen on resume and still makes none.
    assert setup.count() == 2
    assert setup.op_commits() == [manual]
    with pytest.raises(cp.RunFrozen):
        setup.run()
    assert setup.count() == 2
    assert setup.remote_sha() is None


@pytest.mark.parametrize("crash", [None, "after_commit[act_intent:branch]"])
def test_branch_made_elsewhere_is_drift(setup: Setup, crash: str | None) -> None:
    initial = git(setup.repo, "rev-parse", "HEAD")
    if crash is not None:  # the branch appears while the intent is in flight
        assert setup.spawn(crash) == -signal.SIGKILL
    git(setup.repo, "branch", "feature", initial)
    with pytest.raises(cp.RunFrozen) as frozen:
        setup.run()
    assert frozen.value.status == "needs_review"
    assert isinstance(frozen.value.cause, cp.DriftError)
    info = setup.ledger().get_run(RUN_ID)
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert "drift" in (info.evidence or {})
    assert git(setup.repo, "rev-parse", "refs/heads/feature") == initial
    assert setup.remote_sha() is None  # nothing pushed
    assert "push" not in [s.key for s in info.steps]


@pytest.mark.parametrize("crash", [None, "after_commit[act_intent:push]"])
def test_remote_diverged_is_drift(setup: Setup, crash: str | None) -> None:
    git(setup.repo, "commit", "-q", "--allow-empty", "-m", "elsewhere")
    git(setup.repo, "push", "-q", "origin", "HEAD:refs/heads/feature")
    elsewhere = git(setup.repo, "rev-parse", "HEAD")
    git(setup.repo, "reset", "-q", "--hard", "HEAD~1")
    if crash is not None:
        assert setup.spawn(crash) == -signal.SIGKILL
    with pytest.raises(cp.RunFrozen) as frozen:
        setup.run()
    assert isinstance(frozen.value.cause, cp.DriftError)
    assert setup.remote_sha() == elsewhere  # never forced
    assert len(setup.op_commits()) == 1


def test_rejected_push_is_drift_not_unknown(setup: Setup) -> None:
    """The remote refusing a non-fast-forward proves nothing happened: DriftError, not an
    unknown outcome to look up."""
    tool = GitTool(setup.repo)
    call = cp.Call(
        run_id="x",
        step="push",
        operation_id="x/push",
        intent_digest="d" * 64,
        params={"op": "push", "branch": "main"},
    )
    prepared = tool.prepare(call)
    git(setup.repo, "commit", "-q", "--allow-empty", "-m", "elsewhere")
    git(setup.repo, "push", "-q", "origin", "main")
    git(setup.repo, "reset", "-q", "--hard", "HEAD~1")
    call = replace(call, prepared=prepared)
    with pytest.raises(cp.DriftError, match="non-fast-forward"):
        tool.execute(call)
    with pytest.raises(cp.DriftError):
        tool.lookup(call)


def test_remote_hook_refusal_is_permanent(setup: Setup) -> None:
    hook = setup.remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'no pushes today' >&2\nexit 1\n")
    hook.chmod(0o755)
    with pytest.raises(cp.RunFailed, match="remote rejected"):
        setup.run()
    info = setup.ledger().get_run(RUN_ID)
    assert {s.key: s.status for s in info.steps}["push"] is cp.StepStatus.FAILED
    assert setup.remote_sha() is None
    assert len(setup.op_commits()) == 1


@pytest.mark.parametrize("crash", [None, "after_commit[act_intent:push]"])
def test_push_fast_forwards_a_remote_behind(
    setup: Setup, reference: str, crash: str | None
) -> None:
    git(setup.repo, "push", "-q", "origin", "main:refs/heads/feature")  # an ancestor
    if crash is not None:
        assert setup.spawn(crash) == -signal.SIGKILL
    check_done(setup, setup.run(), reference)


@pytest.mark.parametrize("mode", ["paths", "all"])
def test_commit_after_crash_with_staged_deletion(setup: Setup, mode: str) -> None:
    """A crash after staging a deletion: re-staging must not trip on the vanished path."""
    ws, tool = cp.Workspace(setup.repo), GitTool(setup.repo)
    params: dict[str, Any] = {"all": True} if mode == "all" else {"paths": ["README.md", "c.txt"]}

    @cp.workflow("git-delete", version="1")
    def delete(ctx: cp.Context) -> dict[str, Any]:
        ctx.act("rm", ws, op="delete", path="README.md")
        ctx.act("add", ws, op="write", path="c.txt", content="c\n")
        result: dict[str, Any] = ctx.act("commit", tool, op="commit", message="swap", **params)
        return result

    crashing = setup.ledger(crash_points=cp.CrashPoints(match="inside[act:commit:staged]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(delete, run_id="del")
    crashing.close()  # the crashed "process" is gone before the resume
    assert git(setup.repo, "status", "--porcelain").splitlines() == ["D  README.md", "A  c.txt"]
    assert setup.count() == 1
    result = setup.ledger().run(delete, run_id="del")
    assert setup.count() == 2
    assert result["sha"] == git(setup.repo, "rev-parse", "HEAD")
    assert git(setup.repo, "ls-tree", "--name-only", "HEAD").split() == [".gitignore", "c.txt"]
    assert git(setup.repo, "status", "--porcelain") == ""
    assert setup.op_commits("del/commit") == [result["sha"]]


def test_files_changed_after_the_intent_is_drift(setup: Setup) -> None:
    """The tree to commit is fixed with the intent: an edit made while the act was in
    flight is not silently committed."""
    ws, tool = cp.Workspace(setup.repo), GitTool(setup.repo)

    @cp.workflow("git-edit", version="1")
    def edit(ctx: cp.Context) -> Any:
        ctx.act("w", ws, op="write", path="a.txt", content="mine\n")
        return ctx.act("commit", tool, op="commit", message="a", paths=["a.txt"])

    crashing = setup.ledger(crash_points=cp.CrashPoints(match="after_commit[act_intent:commit]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(edit, run_id="edit")
    crashing.close()
    (setup.repo / "a.txt").write_text("someone else's\n")
    with pytest.raises(cp.RunFrozen) as frozen:
        setup.ledger().run(edit, run_id="edit")
    assert isinstance(frozen.value.cause, cp.DriftError)
    assert setup.count() == 1


def test_a_same_second_rewrite_in_place_is_committed(setup: Setup) -> None:
    """Racy git: a file rewritten in place (its inode), at the same size, in the second its
    index entry was stamped, as a formatter swapping quotes does. git re-reads it because
    the index is of that second too; the tool's scratch copy of the index must be dated
    so as well, or it stages the old blob and the commit freezes as drift. (Made certain:
    the dates set back 100 s, ctime not trusted: git compares whole seconds.)"""
    git(setup.repo, "config", "core.trustctime", "false")
    code, index = setup.repo / "code.py", setup.repo / ".git" / "index"
    past = (time.time_ns() // 10**9 - 100) * 10**9
    code.write_text("x = 'a'\n")
    os.utime(code, ns=(past, past))
    git(setup.repo, "add", "code.py")
    git(setup.repo, "commit", "-q", "-m", "code")
    with code.open("r+") as f:
        f.write('x = "a"\n')
    os.utime(code, ns=(past, past))
    os.utime(index, ns=(past, past))
    tool = GitTool(setup.repo)

    @cp.workflow("git-racy", version="1")
    def racy(ctx: cp.Context) -> Any:
        return ctx.act("commit", tool, op="commit", message="format", paths=["code.py"])

    result = setup.ledger().run(racy, run_id="racy")
    assert git(setup.repo, "show", f"{result['sha']}:code.py") == 'x = "a"'
    assert git(setup.repo, "status", "--porcelain") == ""


def test_refusals_are_permanent_and_change_nothing(setup: Setup) -> None:
    tool = GitTool(setup.repo)
    (setup.repo / "debug.log").write_text("ignored\n")
    cases: dict[str, dict[str, Any]] = {
        "missing": {"op": "commit", "message": "m", "paths": ["nope.txt"]},
        "nothing": {"op": "commit", "message": "m", "all": True},
        "ignored": {"op": "commit", "message": "m", "paths": ["debug.log"]},
        "trailer": {
            "op": "commit",
            "message": "m\n\nCrashproof-Operation: forged",
            "paths": [".gitignore"],
            "allow_empty": True,
        },
        "escape": {"op": "commit", "message": "m", "paths": ["../x"]},
        "bad-name": {"op": "branch", "name": "a..b"},
        "bad-start": {"op": "branch", "name": "x", "start": "no-such-rev"},
        "no-branch": {"op": "push", "branch": "nope"},
        "no-remote": {"op": "push", "branch": "main", "remote": "upstream"},
        "bad-op": {"op": "rebase"},
    }

    @cp.workflow("git-bad", version="1")
    def bad(ctx: cp.Context) -> dict[str, str]:
        out = {}
        for key, params in cases.items():
            try:
                ctx.act(key, tool, **params)
            except cp.ActFailed as exc:
                out[key] = str(exc)
        return out

    before = git(setup.repo, "for-each-ref")
    out = setup.ledger().run(bad, run_id="bad")
    assert sorted(out) == sorted(cases)
    assert "match no file" in out["missing"]
    assert "nothing to commit" in out["nothing"]
    assert "ignored" in out["ignored"]  # git's own stderr
    assert "trailers of its own" in out["trailer"]
    assert "not a valid branch name" in out["bad-name"]
    info = setup.ledger().get_run("bad")
    assert {s.key: s.status for s in info.steps} == dict.fromkeys(cases, cp.StepStatus.FAILED)
    assert git(setup.repo, "for-each-ref") == before
    assert git(setup.repo, "status", "--porcelain") == ""  # debug.log is ignored
