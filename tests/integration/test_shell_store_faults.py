"""cp.Shell when the machine fails under its snapshot store (a file where a directory
goes, a full disk, a stalled git): before the command starts the run stops resumable
with nothing of the act recorded, after it ran the outcome is looked up; never a failed
run, and once the fault is gone the resume ends as a run that never faulted. Real
failures: the kernel's ENOTDIR/EEXIST, a real tmpfs filling up, the real git stalled."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

from .disks import fill
from .test_shell_tool import ledger, make_workspace

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform != "linux", reason="process groups and /proc: Linux"),
]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


def files_of(root: Path) -> dict[str, bytes]:
    """The workspace's files outside .git, byte for byte."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def store_fault_flow(shell: cp.Shell, workspace: cp.Workspace, log: Path) -> cp.Workflow[Any]:
    script = f"echo ran >> {log}; echo 'a = 42' > src/a.py; echo out; exit 3"

    @cp.workflow("store-fault")
    def flow(ctx: cp.Context) -> Any:
        ctx.act("edit", workspace, op="write", path="src/c.py", content="c = 3\n")
        result = ctx.act("cmd", shell, argv=["sh", "-c", script])
        return {k: v for k, v in result.items() if k != "duration_s"}

    return flow


@pytest.mark.parametrize("fault", ["store", "spool"])
def test_a_store_the_machine_cannot_write_stops_the_run_resumable(
    ws: Path, tmp_path: Path, fault: str
) -> None:
    """A file where the store's directory goes (the kernel's ENOTDIR/EEXIST), met by the
    snapshot before the command (``store``: nothing of the act journaled) or by its
    spool once the intent is (``spool``): nothing ran, the run stops resumable saying
    what failed and what to do, never ``failed``, no unknown outcome recorded. With the
    file gone, a resume runs the command once and ends as a run that never faulted."""
    log = tmp_path / "ran.log"
    workspace = cp.Workspace(ws)
    if fault == "store":
        blocker = tmp_path / "disk"
        shell = cp.Shell(workspace, store=blocker / "store")
    else:
        shell = cp.Shell(workspace)
        shell.snapshots.snapshot([])  # a store in use, whose runs/ is then in the way
        blocker = shell.store / "runs"
    blocker.write_text("a file where the store's directory goes\n")
    flow = store_fault_flow(shell, workspace, log)
    led = ledger(tmp_path, flow)
    with pytest.raises(cp.RunStopped) as stopped:
        led.run(flow, run_id="r")
    message = str(stopped.value)
    assert "cp.Shell's snapshot store failed before the command started" in message
    assert "nothing ran in this attempt; free or repair it, then resume" in message
    stop = [e for e in led.journal("r") if e.type.value == "run_stopped"][-1]
    recorded = stop.payload["evidence"]["unavailable"]["error"]["message"]
    assert f"store {shell.store}; " in recorded  # the whole of it, in the evidence
    assert stopped.value.reason.startswith("unavailable:cmd: ")  # a worker retries it too
    assert led.get_run("r").status is cp.RunStatus.STOPPED
    assert not log.exists()  # nothing ran
    kinds = [e.type.value for e in led.journal("r") if e.key == "cmd"]
    assert "act_unknown" not in kinds
    assert "step_done" not in kinds
    assert ("act_intent" in kinds) is (fault == "spool")
    if fault == "store":
        with pytest.raises(cp.RunStopped):  # still there: stopped again, never failed
            led.resume("r")
    else:  # the act in flight: whether it changed the edit's file needs its store
        with pytest.raises(cp.RunFrozen, match="a later resume reads them again"):
            led.resume("r")
        reason = str(led.get_run("r").reason)  # the target: the file's absolute path
        assert "whether 'cmd' changed " in reason
        assert "src/c.py cannot be told" in reason
    blocker.unlink()
    result = led.resume("r")
    assert log.read_text() == "ran\n"  # the command ran once
    assert result["exit_code"] == 3  # the command's own failure: a result
    assert led.get_run("r").status is cp.RunStatus.SUCCEEDED
    led.close()
    # The same as a run that never faulted, in a twin workspace.
    twin = make_workspace(tmp_path / "twin")
    twin_ws = cp.Workspace(twin)
    twin_flow = store_fault_flow(cp.Shell(twin_ws), twin_ws, tmp_path / "twin.log")
    clean = cp.Ledger(f"sqlite:///{tmp_path / 'twin.db'}")
    clean.register(twin_flow)
    assert clean.run(twin_flow, run_id="r") == result
    assert files_of(twin) == files_of(ws)
    clean.close()


def test_an_external_command_that_never_started_runs_once_on_resume(
    ws: Path, tmp_path: Path
) -> None:
    """An ``external`` command (nothing can look it up) whose spool is in the way at every
    attempt: the run stops, and the stop records that its last attempt ran nothing. With
    the store repaired, the resume runs the command once, no question asked (before
    that record counted, it froze for review), and ends as a run that never faulted."""

    def send_flow(shell: cp.Shell, outside: Path) -> cp.Workflow[Any]:
        script = f"echo sent >> {outside}; echo out"

        @cp.workflow("send")
        def flow(ctx: cp.Context) -> Any:
            result = ctx.act("send", shell, argv=["sh", "-c", script], effect="external")
            return {k: v for k, v in result.items() if k != "duration_s"}

        return flow

    outside = tmp_path / "sent.log"
    shell = cp.Shell(ws)
    shell.snapshots.snapshot([])  # a store in use, whose runs/ is then in the way
    blocker = shell.store / "runs"
    blocker.write_text("a file where the store's directory goes\n")
    flow = send_flow(shell, outside)
    led = ledger(tmp_path, flow)
    with pytest.raises(cp.RunStopped, match="nothing ran in this attempt"):
        led.run(flow, run_id="r")
    assert not outside.exists()
    kinds = [e.type.value for e in led.journal("r") if e.key == "send"]
    assert kinds[-1] == "run_stopped"
    assert "act_unknown" not in kinds
    blocker.unlink()
    result = led.resume("r")
    assert outside.read_text() == "sent\n"  # once
    assert led.get_run("r").status is cp.RunStatus.SUCCEEDED
    led.close()
    twin = make_workspace(tmp_path / "twin")
    twin_out = tmp_path / "twin-sent.log"
    twin_flow = send_flow(cp.Shell(twin), twin_out)
    clean = cp.Ledger(f"sqlite:///{tmp_path / 'twin.db'}")
    clean.register(twin_flow)
    assert clean.run(twin_flow, run_id="r") == result
    assert twin_out.read_text() == outside.read_text()
    assert files_of(twin) == files_of(ws)
    clean.close()


def test_a_disk_that_fills_up_under_the_command_settles_its_outcome(
    small_disk: Path, tmp_path: Path
) -> None:
    """The command ran and filled the disk, so its result cannot be recorded (the
    snapshot after it: ENOSPC): an unknown outcome, looked up (no completion record),
    and the workspace cannot be put back on the full disk either: the run stops
    resumable, never ``failed``. With space freed, the resume puts the snapshot back and
    runs the command again: it lands once, as in a run on a disk with room."""
    ws = make_workspace(small_disk / "ws")
    log = tmp_path / "ran.log"
    script = f"echo ran >> {log}; echo 'a = 42' > src/a.py; mkdir -p build; "
    script += "head -c 3M /dev/zero > build/f.bin"  # ignored: a restore leaves it
    workspace = cp.Workspace(ws)
    shell = cp.Shell(workspace)

    @cp.workflow("disk-full")
    def flow(ctx: cp.Context, shell: cp.Shell = shell, ws: cp.Workspace = workspace) -> Any:
        ctx.act("edit", ws, op="write", path="src/c.py", content="c = 3\n")
        result = ctx.act("cmd", shell, argv=["sh", "-c", script])
        return {k: v for k, v in result.items() if k != "duration_s"}

    shell.snapshots.snapshot([])  # the store made while there was room
    filler = fill(small_disk, 1 << 20)
    led = ledger(tmp_path, flow)
    with pytest.raises(cp.RunStopped) as stopped:
        led.run(flow, run_id="r")
    assert stopped.value.reason.startswith("unavailable:cmd: cp.Shell's snapshot store failed")
    assert led.get_run("r").status is cp.RunStatus.STOPPED
    assert log.read_text() == "ran\n"
    cmd = [e for e in led.journal("r") if e.key == "cmd"]
    unknown = [e.payload["error"] for e in cmd if e.type.value == "act_unknown"]
    assert len(unknown) == 1  # it ran: an unknown outcome, looked up, not a failure
    assert "'sh' ran (exit 1) but cp.Shell's store could not record it" in unknown[0]["message"]
    assert "step_done" not in [e.type.value for e in cmd]
    filler.unlink()
    result = led.resume("r")
    assert log.read_text() == "ran\nran\n"  # run again over its put-back snapshot
    led.close()
    twin = make_workspace(tmp_path / "twin")
    twin_ws = cp.Workspace(twin)
    twin_shell = cp.Shell(twin_ws)

    @cp.workflow("disk-full")
    def clean_flow(ctx: cp.Context) -> Any:
        return flow.fn(ctx, shell=twin_shell, ws=twin_ws)

    clean = cp.Ledger(f"sqlite:///{tmp_path / 'twin.db'}")
    clean.register(clean_flow)
    assert clean.run(clean_flow, run_id="r") == result
    assert files_of(twin) == files_of(ws)
    clean.close()


def test_a_store_whose_git_stalls_stops_the_run_resumable(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git process in the store that outlives its timeout (a stalled disk: the real
    git behind a PATH entry that waits first, the timeout shortened) is the machine's
    too: the run stops resumable, nothing ran, and a resume with the disk back runs it."""
    from crashproof.tools import _snapshot

    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "git").write_text(
        '#!/bin/sh\ncase "$GIT_DIR" in *crashproof-shell*) sleep 5;; esac\n'
        f'exec {real.stdout.strip()} "$@"\n'
    )
    (shim / "git").chmod(0o755)
    log = tmp_path / "ran.log"
    workspace = cp.Workspace(ws)
    flow = store_fault_flow(cp.Shell(workspace), workspace, log)
    led = ledger(tmp_path, flow)
    monkeypatch.setattr(_snapshot, "_TIMEOUT", 0.5)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(cp.RunStopped, match="snapshot store failed before the command started"):
        led.run(flow, run_id="r")
    assert led.get_run("r").status is cp.RunStatus.STOPPED
    assert not log.exists()
    monkeypatch.undo()
    assert led.resume("r")["exit_code"] == 3
    assert log.read_text() == "ran\n"
    led.close()


def test_an_async_workflow_stops_resumable_on_the_store_too(ws: Path, tmp_path: Path) -> None:
    """The snapshot runs in a worker thread under the async shell: the same stop."""
    log = tmp_path / "ran.log"
    blocker = tmp_path / "disk"
    blocker.write_text("a file where the store's directory goes\n")
    shell = cp.Shell(ws, store=blocker / "store")

    @cp.workflow("async-store-fault")
    async def flow(ctx: cp.AsyncContext) -> Any:
        done = await ctx.act("cmd", shell, argv=["sh", "-c", f"echo ran >> {log}"])
        return done["exit_code"]

    async def main() -> Any:
        led = ledger(tmp_path, flow)
        with pytest.raises(cp.RunStopped, match="snapshot store failed before the command"):
            await led.run_async(flow, run_id="r")
        blocker.unlink()
        try:
            return await led.resume_async("r")
        finally:
            led.close()

    assert asyncio.run(main()) == 0
    assert log.read_text() == "ran\n"


def test_a_store_whose_init_a_kill_cut_short_is_made_again(ws: Path) -> None:
    """A runner killed with its store's git init (the child killed too, as a machine's
    crash does) leaves config.lock in a store it never finished: the next snapshot
    makes the store under its lock, where such a lock file is stale (git init refused
    "could not lock config file ...: File exists" for ever, make chaos-short)."""
    from crashproof.tools._snapshot import SnapshotStore, default_store

    store = default_store(ws)
    store.mkdir(parents=True)
    (store / "HEAD").write_text("ref: refs/heads/main\n")
    (store / "config.lock").write_text("[core]\n")
    tree = SnapshotStore(ws, store).snapshot([])
    assert len(tree) == 40
    assert not (store / "config.lock").exists()


@pytest.mark.parametrize("made", [True, False], ids=["store-made", "store-being-made"])
def test_a_snapshot_waits_for_the_git_a_killed_runner_left_in_the_store(
    ws: Path, tmp_path: Path, made: bool
) -> None:
    """A runner killed in the middle of a snapshot (SIGKILL does not reach its children)
    leaves its git working in the store. The next snapshot must wait for that git, not
    take its index.lock for a stale one and race it ("the snapshot store failed" after
    a recovery kill, make chaos): the lock's descriptor lives on in every git started
    under it. Here the orphan's git is the real one behind a shim that signals, waits a
    second, runs git and notes when it is done."""
    from crashproof.tools._snapshot import SnapshotStore, default_store

    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True)
    shim, started, done = tmp_path / "bin", tmp_path / "started", tmp_path / "done"
    shim.mkdir()
    (shim / "git").write_text(
        '#!/bin/sh\ncase "$GIT_DIR" in *crashproof-shell*)\n'
        f'  touch {started}; sleep 1; {real.stdout.strip()} "$@"; s=$?; touch {done}; exit $s;;\n'
        f'esac\nexec {real.stdout.strip()} "$@"\n'
    )
    (shim / "git").chmod(0o755)
    store = default_store(ws)
    if made:  # else the runner's first git is the store's init
        SnapshotStore(ws, store).snapshot([])  # the store made, its indexes filled
    (ws / "src" / "a.py").write_text("a = 2\n")
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from crashproof.tools._snapshot import SnapshotStore; "
            "SnapshotStore(Path(sys.argv[1]), Path(sys.argv[2])).snapshot([])",
            str(ws),
            str(store),
        ],
        env={**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"},
    )
    try:
        for _ in range(400):
            if started.exists():
                break
            if runner.poll() is not None:
                pytest.fail("the runner ended before its git started")
            subprocess.run(["sleep", "0.01"], check=True)
        else:
            pytest.fail("the runner's git never started")
        runner.kill()  # the runner dies; its git, an orphan now, goes on
        runner.wait()
        assert not done.exists()
        tree = SnapshotStore(ws, store).snapshot([])
        assert done.exists(), "the snapshot ran while the dead runner's git still worked"
        listed = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", tree],
            env={"GIT_DIR": str(store), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "scope/src/a.py" in listed.splitlines()
    finally:
        if runner.poll() is None:
            runner.kill()


def test_observing_reaps_a_command_whose_runner_was_killed(ws: Path, tmp_path: Path) -> None:
    """A runner SIGKILLed while its command runs leaves the command writing into the
    workspace (its own session: the kill does not reach it). A resume observes the
    workspace before it recovers that act, so the observation reaps the orphan first
    (make chaos: an observation that met a file renamed away under its walk froze the
    run, and a codemod went on writing after its run had finished). A command whose
    runner lives is left alone."""
    beat = tmp_path / "beat"
    script = f"while true; do date +%s%N > {beat}; sleep 0.02; done"
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import dataclasses, sys; from pathlib import Path; import crashproof as cp; "
            "from crashproof.tools.port import Call; "
            "shell = cp.Shell(cp.Workspace(Path(sys.argv[1]))); "
            "call = Call(run_id='r', step='s', operation_id='r/s', intent_digest='d', "
            "params={'argv': ['sh', '-c', sys.argv[2]], 'effect': 'external'}); "
            "shell.execute(dataclasses.replace(call, prepared=shell.prepare(call)))",
            str(ws),
            script,
        ],
    )
    try:
        for _ in range(500):
            if beat.exists():
                break
            if runner.poll() is not None:
                pytest.fail("the runner ended before its command started")
            subprocess.run(["sleep", "0.01"], check=True)
        else:
            pytest.fail("the command never started")
        shell = cp.Shell(cp.Workspace(ws))
        (marker,) = (shell.store / "runs").glob("*.running.json")
        shell.observe()
        assert marker.exists(), "a live runner's command was reaped"
        runner.kill()  # the runner dies; its command, an orphan now, goes on
        runner.wait()
        shell.observe()
        assert not marker.exists()
        last = beat.read_text()
        subprocess.run(["sleep", "0.2"], check=True)
        assert beat.read_text() == last, "the orphan still runs"
    finally:
        if runner.poll() is None:
            runner.kill()


def test_git_s_why_after_a_long_store_path_reaches_the_reason(ws: Path, tmp_path: Path) -> None:
    """git's own error puts the store's long path first and the kernel's why last
    (``git init``: "<store>/objects/pack: Not a directory", a file where its objects
    directory goes): cp.Shell's message keeps git's end, so the stop's reason and its
    evidence say why, not only where (cut to git's first 300 characters, both ended
    inside the path)."""
    store = tmp_path / ("a" * 200) / ("b" * 200) / "store"
    store.mkdir(parents=True)
    (store / "objects").write_text("a file where git's objects directory goes\n")
    workspace = cp.Workspace(ws)
    flow = store_fault_flow(cp.Shell(workspace, store=store), workspace, tmp_path / "ran.log")
    led = ledger(tmp_path, flow)
    with pytest.raises(cp.RunStopped) as stopped:
        led.run(flow, run_id="r")
    why = "/objects/pack: Not a directory)"
    reason = stopped.value.reason
    assert reason.startswith("unavailable:cmd: cp.Shell's snapshot store failed before ")
    assert reason.endswith(why)
    assert " … " in reason
    stop = [e for e in led.journal("r") if e.type.value == "run_stopped"][-1]
    recorded = stop.payload["evidence"]["unavailable"]["error"]["message"]
    assert f"store {store}; OSError: git init in the shell store failed: /" in recorded
    assert recorded.endswith(why)  # the tool's message: git's start and end, bounded
    led.close()
