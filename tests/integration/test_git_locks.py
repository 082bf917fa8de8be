"""Git lock files after a crash (#26 item 1). The child's whole process group is SIGKILLed
while a real git holds a lock (inside a clean filter of ``git add``, which runs with the
index lock held, or inside the ``reference-transaction`` hook, which runs with the ref
lock held): the lock is our own and its holder is dead, so the resume clears it and the
act commits once. A lock that no dead git command of ours explains is left where it is,
and the act is frozen for a later resume, never recorded as failed."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.tools._git_locks import OWNER_FILE
from crashproof.tools.git import GitTool

from .git_child import RUN_ID, hooked
from .test_git_tool import CHILD, Setup, git, make_setup

pytestmark = pytest.mark.timeout(60)

KILLER = """#!/bin/sh
# $1: when to kill ("scratch": a git add into a scratch index, "index": into the real one,
# "ref": a ref transaction, with its locks held); $2: a directory made once, so one kill.
case "$1" in
  scratch) [ -n "$GIT_INDEX_FILE" ] || exec cat ;;
  index) [ -z "$GIT_INDEX_FILE" ] || exec cat ;;
  ref) [ "$3" = prepared ] || exit 0 ;;
esac
if mkdir "$2" 2>/dev/null; then kill -KILL 0; fi
[ "$1" = ref ] && exit 0
exec cat
"""


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return make_setup(tmp_path)


def arm(s: Setup, when: str) -> None:
    script = s.root / "killer.sh"
    script.write_text(KILLER)
    flag = s.root / "killed"
    if when == "ref":
        hook = s.repo / ".git" / "hooks" / "reference-transaction"
        hook.write_text(f'#!/bin/sh\nexec sh {script} ref {flag} "$1"\n')
        hook.chmod(0o755)
    else:
        (s.repo / ".git" / "info" / "attributes").write_text("a.txt filter=killer\n")
        git(s.repo, "config", "filter.killer.clean", f"sh {script} {when} {flag}")


def spawn_group(s: Setup) -> int:
    """The child in a process group of its own: ``kill -KILL 0`` takes all of it."""
    argv = [sys.executable, str(CHILD), str(s.db), str(s.repo), "none", "git-hooked"]
    return subprocess.run(argv, check=False, timeout=30, start_new_session=True).returncode


def lock_files(repo: Path) -> list[str]:
    git_dir = repo / ".git"
    return sorted(str(p.relative_to(git_dir)) for p in git_dir.rglob("*.lock"))


def commits_of_operation(s: Setup) -> list[str]:
    out = git(s.repo, "log", "--format=%(trailers:key=Crashproof-Operation,valueonly)", "main")
    return [line for line in out.splitlines() if line == f"{RUN_ID}/commit"]


@pytest.mark.parametrize(
    ("when", "left"),
    [
        ("scratch", "crashproof-"),  # prepare's scratch index: …index.tmp.lock
        ("index", "index.lock"),  # execute's git add of the real index
        ("ref", "refs/heads/main.lock"),  # update-ref, between lock and rename
    ],
)
def test_our_dead_gits_lock_is_cleared_and_the_act_commits_once(
    setup: Setup, when: str, left: str
) -> None:
    arm(setup, when)
    assert spawn_group(setup) == -signal.SIGKILL
    assert any(name.startswith(left) for name in lock_files(setup.repo)), lock_files(setup.repo)
    ledger = setup.ledger()
    try:
        result = ledger.run(hooked, run_id=RUN_ID, repo=str(setup.repo))
    finally:
        setup.close()
    assert result == {"sha": git(setup.repo, "rev-parse", "main"), "branch": "main"}
    assert commits_of_operation(setup) == [f"{RUN_ID}/commit"]
    assert lock_files(setup.repo) == []
    assert (setup.repo / ".git" / OWNER_FILE).read_bytes() == b""  # no command of ours runs


def foreign_lock(s: Setup, record: dict[str, object] | None) -> Path:
    """An index lock the test makes, as another program's git would, after ``record``."""
    if record is not None:
        (s.repo / ".git" / OWNER_FILE).write_text(json.dumps(record))
    lock = s.repo / ".git" / "index.lock"
    lock.write_bytes(b"")
    return lock


@pytest.mark.parametrize(
    "record",
    [
        None,  # no git command of ours was running: the lock is someone else's
        # ours was running, but on another host: its processes are not ours to judge
        {"host": "elsewhere", "pid": 1, "started": time.time() - 1, "timeout": 120.0},
        # ours was running on this host, but ended long before the lock was made
        {"host": socket.gethostname(), "pid": 1, "started": time.time() - 600, "timeout": 1.0},
    ],
    ids=["no-record", "other-host", "before-the-lock"],
)
def test_a_lock_not_ours_freezes_for_a_later_resume(
    setup: Setup, record: dict[str, object] | None
) -> None:
    lock = foreign_lock(setup, record)
    try:
        with pytest.raises(cp.RunFrozen) as frozen:
            setup.ledger().run(hooked, run_id=RUN_ID, repo=str(setup.repo))
        assert frozen.value.status == "needs_review"
        assert "index.lock" in frozen.value.reason
        assert "remove" in frozen.value.reason
        info = setup.ledger().get_run(RUN_ID)
        assert info.status is cp.RunStatus.NEEDS_REVIEW
        assert all(step.status != "failed" for step in info.steps)
        assert lock.exists()  # never someone else's lock removed
        assert commits_of_operation(setup) == []
        lock.unlink()  # the holder is gone: an operator removes it, as the reason says
        result = setup.ledger().run(hooked, run_id=RUN_ID, repo=str(setup.repo))
    finally:
        setup.close()
    assert result["sha"] == git(setup.repo, "rev-parse", "main")
    assert commits_of_operation(setup) == [f"{RUN_ID}/commit"]


def test_a_live_owner_is_waited_for(setup: Setup) -> None:
    """Another process of ours that runs git in the repository holds the owner file: a
    git command waits for it instead of judging its locks."""
    owner = os.open(setup.repo / ".git" / OWNER_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(owner, fcntl.LOCK_EX)
    git_tool = GitTool(setup.repo, timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(cp.ResourceBusy, match=r"more than 0\.5 s"):
            git_tool._run("update-ref", "refs/heads/x", "HEAD")
    finally:
        os.close(owner)
    assert time.monotonic() - started >= 0.5
    git_tool._run("update-ref", "refs/heads/x", "HEAD")  # released: it runs
    assert git(setup.repo, "rev-parse", "x") == git(setup.repo, "rev-parse", "main")


def test_a_lock_under_a_long_path_freezes_with_a_bounded_reason(tmp_path: Path) -> None:
    """A repository whose path is long (about 600 characters): the freeze's reason keeps
    its start (whose lock) and its end (what to do) around " … " and stays bounded; the
    busy error in its evidence names the whole lock path."""
    root = tmp_path / ("d" * 200) / ("e" * 200) / ("f" * 200)
    root.mkdir(parents=True)
    s = replace(make_setup(root), root=tmp_path)  # the ledger where SQLite opens it
    lock = foreign_lock(s, None)
    try:
        with pytest.raises(cp.RunFrozen) as frozen:
            s.ledger().run(hooked, run_id=RUN_ID, repo=str(s.repo))
        reason = frozen.value.reason
        info = s.ledger().get_run(RUN_ID)
    finally:
        s.close()
    assert reason == info.reason
    assert reason.startswith("act 'commit': a git process that is not ours holds /")
    assert reason.endswith("/.git/index.lock and resume; a later resume tries again")
    assert " … " in reason
    assert len(reason) < 700  # the lock path twice was about 1,400 characters
    busy = (info.evidence or {})["busy"]["message"]
    assert busy.count(str(lock)) == 2  # the whole of it, in the evidence
