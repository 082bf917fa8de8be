"""cp.GitTool when the machine fails under its own bookkeeping (a file where git needs a
directory, a disk that fills up under the repository or under the remote): before the
commit or push lands the run stops resumable, nothing recorded as the act's failure,
and once the fault is gone the resume ends with the commits of a twin run that never
faulted, each effect once. Real failures: the kernel's ENOTDIR and ENOSPC under the real
git, on a real tmpfs (skipped where mount is refused)."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.tools.git import GitTool

from .disks import fill
from .test_git_tool import RUN_ID, Setup, git, make_setup

pytestmark = pytest.mark.timeout(120)

# 260 KB of hex lines: about 140 KB once git has compressed it into a blob.
BIG = "".join(hashlib.sha256(str(i).encode()).hexdigest() + "\n" for i in range(4000))
UNAVAILABLE = "git could not use the repository's files, nothing was committed or pushed"


def _flow(
    ctx: cp.Context, repo: str, big: bool = False, git: str = "git", timeout: float = 120.0
) -> dict[str, Any]:
    ws, tool = cp.Workspace(repo), GitTool(repo, git=git, timeout=timeout)
    ctx.act("write-a", ws, op="write", path="a.txt", content=BIG if big else "alpha\n")
    ctx.act("append-b", ws, op="append", path="notes/b.txt", text="+line-1\n")
    commit = ctx.act(
        "commit", tool, op="commit", message="Add a and b", paths=["a.txt", "notes/b.txt"]
    )
    branch = ctx.act("branch", tool, op="branch", name="feature", start=commit["sha"])
    push = ctx.act("push", tool, op="push", branch="feature")
    return {"commit": commit, "branch": branch, "push": push}


flow: cp.Workflow[dict[str, Any]] = cp.workflow("git-faults", version="1")(_flow)


def setup_in(root: Path) -> Setup:
    root.mkdir(exist_ok=True)
    return make_setup(root)


def ledger(s: Setup, **kw: Any) -> cp.Ledger:
    """A new Ledger (a restarted process) that knows the workflow, to resume it."""
    led = s.ledger(**kw)
    led.register(flow)
    return led


def blob_of(text: str) -> str:
    return subprocess.run(
        ["git", "hash-object", "--stdin"], input=text, capture_output=True, text=True, check=True
    ).stdout.strip()


def stop_message(s: Setup) -> str:
    """The whole error of the run's last stop, kept in its evidence (the reason is cut)."""
    stop = [e for e in ledger(s).journal(RUN_ID) if e.type.value == "run_stopped"][-1]
    return str(stop.payload["evidence"]["unavailable"]["error"]["message"])


def history(repo: Path, rev: str) -> list[str]:
    """Each commit of ``rev`` by its tree, subject and operation trailer (its sha and
    intent digest name its parent and dates, which a twin repository does not share)."""
    fmt = "%T %s %(trailers:key=Crashproof-Operation,valueonly,separator=%x2c)"
    return git(repo, "log", f"--format={fmt}", rev).splitlines()


def stop_on_fault(s: Setup, key: str, what: str, **kw: Any) -> None:
    """The first run meets the fault: stopped resumable at ``key``, never failed."""
    with pytest.raises(cp.RunStopped) as stopped:
        ledger(s, **kw).run(flow, run_id=RUN_ID, repo=str(s.repo), big=True)
    assert stopped.value.reason.startswith(f"unavailable:{key}: ")
    assert what in str(stopped.value)
    led = ledger(s)
    assert led.get_run(RUN_ID).status is cp.RunStatus.STOPPED
    kinds = [e.type.value for e in led.journal(RUN_ID) if e.key == key]
    assert "step_done" not in kinds  # nothing recorded as the act's result
    assert "act_unknown" not in kinds  # nothing landed: no outcome to look up


def resume_and_match_twin(s: Setup, tmp_path: Path) -> None:
    """The resume ends as a run that never faulted: the same commits, each effect once."""
    result = ledger(s).resume(RUN_ID)
    assert ledger(s).get_run(RUN_ID).status is cp.RunStatus.SUCCEEDED
    head = git(s.repo, "rev-parse", "main")
    assert s.op_commits() == [head]  # committed once
    assert s.count() == 2
    assert s.remote_sha() == head  # pushed once, that very commit
    assert result["commit"] == {"sha": head, "branch": "main"}
    assert git(s.repo, "status", "--porcelain") == ""
    twin = setup_in(tmp_path / "twin")
    twin_result = ledger(twin).run(flow, run_id=RUN_ID, repo=str(twin.repo), big=True)
    twin.close()
    assert history(s.repo, "main") == history(twin.repo, "main")
    assert history(s.remote, "feature") == history(twin.remote, "feature")
    assert s.fingerprint() == twin.fingerprint()
    assert result.keys() == twin_result.keys()


def test_a_file_where_git_needs_a_directory_stops_the_commit_resumable(tmp_path: Path) -> None:
    """A file where git's objects/<xx> directory goes: ``git add`` of the scratch index
    in ``prepare`` cannot write a file's blob ("unable to create temporary file: Not a
    directory"): the machine's, not the act's. It was a recorded failure (RunFailed)."""
    s = setup_in(tmp_path / "faulty")
    objects = s.repo / ".git" / "objects"
    blobs = [blob_of(BIG), blob_of("+line-1\n")]  # a.txt's, notes/b.txt's
    free = [objects / sha[:2] for sha in blobs if not (objects / sha[:2]).exists()]
    if not free:
        pytest.skip("the initial commit holds objects under both blobs' directories")
    blocker = free[0]
    blocker.write_text("a file where git's objects directory goes\n")
    try:
        stop_on_fault(s, "commit", UNAVAILABLE)
        assert "unable to create temporary file: Not a directory" in stop_message(s)
        with pytest.raises(cp.RunStopped):  # still there: stopped again, never failed
            ledger(s).resume(RUN_ID)
        assert s.count() == 1
        blocker.unlink()
        resume_and_match_twin(s, tmp_path)
    finally:
        s.close()


@pytest.mark.parametrize(
    ("point", "leave", "error"),
    [
        # Before the commit's intent: prepare's scratch index (the Python copy, the
        # repository's owner file) on a disk with no room left ...
        ("after_commit[step_done:append-b]", 0, "OSError: [Errno 28] No space left on device"),
        # ... or git writing a.txt's blob there.
        (
            "after_commit[step_done:append-b]",
            64 << 10,
            "git add exited 128: fatal: unable to write loose object file: No space left",
        ),
        # In execute, the files staged, before the branch moves (commit-tree's object,
        # then each retry's scratch index): retried, then stopped with its intent open.
        ("inside[act:commit:staged]", 0, "OSError: [Errno 28] No space left on device"),
    ],
)
def test_a_disk_that_fills_up_under_the_commit_stops_the_run_resumable(
    small_disk: Path, tmp_path: Path, point: str, leave: int, error: str
) -> None:
    """The repository on a real tmpfs that fills up (ENOSPC) before the branch moves:
    stopped resumable, never failed (a recorded failure before: RunFailed); with room
    again the resume commits once, as a run on a disk with room did."""
    s = replace(setup_in(small_disk), root=tmp_path)  # the ledger is not on that disk
    filled: list[Path] = []
    points = cp.CrashPoints(match=point, action=lambda _: filled.append(fill(small_disk, leave)))
    try:
        stop_on_fault(s, "commit", UNAVAILABLE, crash_points=points)
        assert filled, f"{point} was never reached"
        assert error in stop_message(s)
        kinds = [e.type.value for e in ledger(s).journal(RUN_ID) if e.key == "commit"]
        assert kinds.count("act_intent") == (3 if "staged" in point else 0)
        assert s.count() == 1
        filled[0].unlink()
        resume_and_match_twin(s, tmp_path)
    finally:
        s.close()


def remount(disk: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(disk)], check=True)


def test_a_repository_on_a_read_only_disk_stops_the_commit_resumable(
    small_disk: Path, tmp_path: Path
) -> None:
    """The repository's disk remounted read-only before the commit (as a file system
    that turned read-only on errors): prepare's scratch index cannot be written (EROFS).
    Stopped resumable; remounted read-write, the resume commits once."""
    s = replace(setup_in(small_disk), root=tmp_path)
    points = cp.CrashPoints(
        match="after_commit[step_done:append-b]", action=lambda _: remount(small_disk, "ro")
    )
    try:
        stop_on_fault(s, "commit", UNAVAILABLE, crash_points=points)
        assert "[Errno 30] Read-only file system" in stop_message(s)
        remount(small_disk, "rw")
        resume_and_match_twin(s, tmp_path)
    finally:
        remount(small_disk, "rw")
        s.close()


def stalling_git(tmp_path: Path, *commands: str) -> tuple[Path, Path]:
    """The real git behind a wrapper that sleeps 30 s in any of ``commands`` while the
    returned flag file exists (a disk or a machine that hangs): (wrapper, flag)."""
    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True)
    flag, shim = tmp_path / "stall", tmp_path / "git"
    cases = "|".join(f'*" {c} "*' for c in commands)
    shim.write_text(
        f'#!/bin/sh\ncase " $* " in {cases}) [ -e {flag} ] && exec sleep 30;; esac\n'
        f'exec {real.stdout.strip()} "$@"\n'
    )
    shim.chmod(0o755)
    return shim, flag


def test_a_git_that_stalls_stops_the_commit_resumable(tmp_path: Path) -> None:
    """The real git behind a wrapper that, while a flag file exists, stalls in ``git add``
    (a disk that hangs) past the tool's timeout: subprocess.TimeoutExpired in prepare,
    the machine's, not the act's (it escaped and failed the run). With the flag gone, the
    resume commits once."""
    s = setup_in(tmp_path / "faulty")
    shim, flag = stalling_git(tmp_path, "add")
    flag.touch()
    args = {"repo": str(s.repo), "big": True, "git": str(shim), "timeout": 2.0}
    try:
        with pytest.raises(cp.RunStopped) as stopped:
            ledger(s).run(flow, run_id=RUN_ID, **args)
        assert stopped.value.reason.startswith(f"unavailable:commit: {UNAVAILABLE}")
        assert "TimeoutExpired" in stop_message(s)
        assert ledger(s).get_run(RUN_ID).status is cp.RunStatus.STOPPED
        flag.unlink()
        resume_and_match_twin(s, tmp_path)
    finally:
        s.close()


def test_a_remote_whose_disk_is_full_stops_the_push_resumable(
    small_disk: Path, tmp_path: Path
) -> None:
    """The remote cannot store the pack ("[remote rejected] (unpacker error)", its git
    saying "No space left on device"): it kept nothing, so the push is not done, and it
    is no refusal of the act either (a permanent failure before: RunFailed)."""
    s = setup_in(tmp_path / "faulty")
    remote = small_disk / "remote.git"
    remote.mkdir()
    git(remote, "init", "-q", "--bare", "-b", "main")
    git(s.repo, "remote", "set-url", "origin", str(remote))
    s = replace(s, remote=remote)
    filled: list[Path] = []
    points = cp.CrashPoints(
        match="after_commit[step_done:branch]",
        action=lambda _: filled.append(fill(small_disk, 0)),
    )
    try:
        with pytest.raises(cp.RunStopped) as stopped:
            ledger(s, crash_points=points).run(flow, run_id=RUN_ID, repo=str(s.repo), big=True)
        assert stopped.value.reason.startswith("unavailable:push: the remote could not store")
        assert "nothing was pushed; free or repair its disk, then resume" in str(stopped.value)
        assert ledger(s).get_run(RUN_ID).status is cp.RunStatus.STOPPED
        assert s.remote_sha() is None
        filled[0].unlink()
        resume_and_match_twin(s, tmp_path)
    finally:
        s.close()


@pytest.mark.parametrize("key", ["commit", "branch"])
def test_a_git_that_stalls_in_executes_reads_stops_the_run_resumable(
    tmp_path: Path, key: str
) -> None:
    """The intent journaled, the real git stalls (a wrapper that sleeps while a flag file
    exists) in the reads ``execute`` makes before the branch moves: the trailer search
    and HEAD (commit), the branch's current sha (branch). TimeoutExpired there is the
    machine's, before anything was done: stopped resumable at once, no unknown outcome
    recorded (before: an unknown outcome, looked up four times under the same stall and
    stopped 'lookup unavailable'). With the flag gone, the resume commits, branches and
    pushes once, as a twin run that never faulted."""
    s = setup_in(tmp_path / "faulty")
    shim, flag = stalling_git(tmp_path, "rev-parse", "symbolic-ref", "log")
    points = cp.CrashPoints(match=f"after_commit[act_intent:{key}]", action=lambda _: flag.touch())
    args = {"repo": str(s.repo), "big": True, "git": str(shim), "timeout": 1.0}
    try:
        with pytest.raises(cp.RunStopped) as stopped:
            ledger(s, crash_points=points).run(flow, run_id=RUN_ID, **args)
        assert flag.exists(), f"the intent of {key} was never journaled"
        assert stopped.value.reason.startswith(f"unavailable:{key}: {UNAVAILABLE}")
        assert "TimeoutExpired" in stop_message(s)
        led = ledger(s)
        assert led.get_run(RUN_ID).status is cp.RunStatus.STOPPED
        kinds = [e.type.value for e in led.journal(RUN_ID) if e.key == key]
        assert "act_unknown" not in kinds  # nothing was done: no outcome to look up
        assert "step_done" not in kinds
        assert s.count() == (1 if key == "commit" else 2)
        flag.unlink()
        resume_and_match_twin(s, tmp_path)
    finally:
        s.close()


def test_a_git_that_stalls_under_the_lookup_stops_the_run_resumable(tmp_path: Path) -> None:
    """A crash leaves the commit in flight (its files staged); on resume the real git
    stalls in ``git log`` (the trailer search), past the tool's timeout, under every
    lookup. The run stops resumable, nothing executed, its reason one line saying what
    failed (before: the raw command line of subprocess.TimeoutExpired). With the flag
    gone, the resume looks it up, commits once, and ends as a twin run."""
    s = setup_in(tmp_path / "faulty")
    shim, flag = stalling_git(tmp_path, "log")
    args = {"repo": str(s.repo), "big": True, "git": str(shim), "timeout": 1.0}
    points = cp.CrashPoints(match="inside[act:commit:staged]")
    try:
        with pytest.raises(cp.SimulatedCrash):
            ledger(s, crash_points=points).run(flow, run_id=RUN_ID, **args)
        flag.touch()
        with pytest.raises(cp.RunStopped) as stopped:
            ledger(s).resume(RUN_ID)
        assert stopped.value.reason.startswith(
            "unavailable:commit: lookup unavailable (git failed 4 lookups: git could not look "
            "the act up, the machine failed under it; free or repair the disk, then resume "
            "(TimeoutExpired: "
        )
        assert ledger(s).get_run(RUN_ID).status is cp.RunStatus.STOPPED
        assert s.count() == 1
        flag.unlink()
        resume_and_match_twin(s, tmp_path)
    finally:
        s.close()


def test_a_git_that_stalls_under_the_receipt_reread_stops_the_run_resumable(
    tmp_path: Path,
) -> None:
    """A crash once the commit's receipt is journaled; on resume the real git stalls in
    ``git log`` under the re-read of that receipt (cp.Unavailable from the lookup). The
    run stops resumable, a stop a worker claims again on its own (before: frozen
    needs_review, which waits for a person). With the flag gone, the resume re-reads the
    receipt and ends as a twin run that never faulted."""
    from crashproof.store.queue import retryable_stop

    s = setup_in(tmp_path / "faulty")
    shim, flag = stalling_git(tmp_path, "log")
    args = {"repo": str(s.repo), "big": True, "git": str(shim), "timeout": 1.0}
    points = cp.CrashPoints(match="after_commit[step_done:commit]")
    try:
        with pytest.raises(cp.SimulatedCrash):
            ledger(s, crash_points=points).run(flow, run_id=RUN_ID, **args)
        flag.touch()
        with pytest.raises(cp.RunStopped) as stopped:
            ledger(s).resume(RUN_ID)
        reason = stopped.value.reason
        assert reason.startswith(
            "unavailable:commit: the receipts of 1 completed act(s) could not be re-read "
            "(git could not look the act up, the machine failed under it; "
        )
        info = ledger(s).get_run(RUN_ID)
        assert info.status is cp.RunStatus.STOPPED
        assert retryable_stop(info.status.value, info.reason)  # a worker resumes it
        assert s.count() == 2
        flag.unlink()
        resume_and_match_twin(s, tmp_path)
    finally:
        s.close()
