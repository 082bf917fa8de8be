"""cp.Shell on real workspaces and real child processes: the snapshot put back exactly,
recorded results (a non-zero exit too), bad input refused with nothing left to trip a
resume, the process group killed on timeout, the ledger's key kept from the command, an
external command's unknown outcome settled as declared, and the policy's command rule."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.tools._snapshot import SnapshotStore

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform != "linux", reason="process groups and /proc: Linux"),
]

GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


def make_workspace(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a = 1\n")
    (root / "src" / "b.py").write_text("b = 2\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "keep.log").write_text("ignored, but tracked\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "add", "-f", "keep.log")
    return root


def ledger(tmp_path: Path, *flows: cp.Workflow[Any], **kw: Any) -> cp.Ledger:
    led = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", **kw)
    for flow in flows:
        led.register(flow)
    return led


def test_a_restore_puts_back_exactly_what_the_snapshot_held(ws: Path) -> None:
    workspace = cp.Workspace(ws)
    store = SnapshotStore(ws, ws / ".git" / "crashproof-shell")
    before = workspace.fingerprint()
    snap = store.snapshot(["build"])
    # A half-run: edits, additions (a new directory too), a deletion, a mode change, a
    # file turned into a directory, a changed .gitignore, the declared path created.
    (ws / "src" / "a.py").write_text("a = 99\n")
    (ws / "src" / "new").mkdir()
    (ws / "src" / "new" / "c.py").write_text("c = 3\n")
    (ws / "src" / "b.py").unlink()
    (ws / "run.sh").chmod(0o644)
    (ws / "keep.log").unlink()
    (ws / "keep.log").mkdir()
    (ws / "keep.log" / "x").write_text("x")
    (ws / ".gitignore").write_text("")
    (ws / "build").mkdir()
    (ws / "build" / "out.o").write_bytes(b"\0\1")
    (ws / "other.log").write_text("hidden by the old rules, shown by the new\n")
    assert workspace.fingerprint() != before
    changed = store.restore(snap, ["build"])
    assert changed >= 6
    assert not (ws / "build").exists()
    assert not (ws / "src" / "new").exists()
    assert (ws / "run.sh").stat().st_mode & stat.S_IXUSR
    # other.log is ignored by the restored rules: not the snapshot's to judge, left alone
    (ws / "other.log").unlink()
    assert workspace.fingerprint() == before
    assert store.restore(snap, ["build"]) == 0  # converged: nothing more to do


def test_a_declared_path_is_snapshotted_whole(ws: Path) -> None:
    store = SnapshotStore(ws, ws / ".git" / "crashproof-shell")
    (ws / "build").mkdir()
    (ws / "build" / "lib.so").write_bytes(b"v1")
    snap = store.snapshot(["build"])
    (ws / "build" / "lib.so").write_bytes(b"v2")
    (ws / "build" / "extra").write_bytes(b"x")
    store.restore(snap, ["build"])
    assert (ws / "build" / "lib.so").read_bytes() == b"v1"
    assert sorted(p.name for p in (ws / "build").iterdir()) == ["lib.so"]


def test_an_unchanged_workspace_is_snapshotted_with_one_git_process(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree of an index whose entries ``git add -A`` left as they were is the one
    noted when it was last written: no ``write-tree`` (the bench's goal, #44). A changed
    entry writes the tree again, the same a store without notes writes."""
    calls = tmp_path / "git.calls"
    shim = tmp_path / "bin"
    shim.mkdir()
    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True)
    (shim / "git").write_text(
        f'#!/bin/sh\nfor a; do case "$a" in -c) ;; *=*) ;; *) echo "$a" >> {calls}; break;; '
        f'esac; done\nexec {real.stdout.strip()} "$@"\n'
    )
    (shim / "git").chmod(0o755)
    store = SnapshotStore(ws, ws / ".git" / "crashproof-shell")
    first = store.snapshot(["build"])
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")

    def commands(snapshot: Any) -> list[str]:
        calls.unlink(missing_ok=True)
        snapshot()
        return calls.read_text().split() if calls.exists() else []

    assert commands(lambda: store.snapshot(["build"])) == ["add"]
    assert store.snapshot(["build"]) == first
    (ws / "src" / "a.py").write_text("a = 2\n")
    assert commands(lambda: store.snapshot(["build"])) == ["add", "write-tree"]
    changed = store.snapshot(["build"])
    fresh = SnapshotStore(ws, tmp_path / "fresh-store").snapshot(["build"])
    assert changed == fresh != first
    # a restore leaves its tree noted: the next snapshot of it is one process again
    store.restore(first, ["build"])
    assert commands(lambda: store.snapshot(["build"])) == ["add"]
    assert store.snapshot(["build"]) == first


def test_the_result_is_recorded_a_non_zero_exit_too(ws: Path, tmp_path: Path) -> None:
    shell = cp.Shell(ws, keep=16)
    script = "printf '\\377\\376binary'; head -c 100000 /dev/zero | tr '\\0' x; echo err >&2; "
    script += "echo new > src/c.py; rm src/a.py; exit 3"

    @cp.workflow("recorded")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("cmd", shell, argv=["sh", "-c", script])

    led = ledger(tmp_path, flow)
    result = led.run(flow, run_id="r")
    assert result["exit_code"] == 3
    assert result["stdout"]["bytes"] == 8 + 100000
    assert result["stdout"]["head"].startswith("\\xff\\xfebinary")  # escaped, still JSON
    assert result["stdout"]["tail"] == "x" * 16
    whole = shell.output(result["stdout"]["blob"])
    assert whole[:8] == b"\xff\xfebinary"
    assert len(whole) == 100008
    assert shell.output(result["stderr"]["blob"]) == b"err\n"
    changes = {c["path"]: c["status"] for c in result["delta"]["changes"]}
    assert changes == {"src/a.py": "D", "src/c.py": "A"}
    assert led.run(flow, run_id="r") == result  # replayed from the journal: not run again
    assert (ws / "src" / "c.py").read_text() == "new\n"
    led.close()


def test_a_command_not_found_is_refused_before_anything(ws: Path, tmp_path: Path) -> None:
    shell = cp.Shell(ws)

    @cp.workflow("missing")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("cmd", shell, argv=["no-such-command-xyz", "--flag"])

    led = ledger(tmp_path, flow)
    with pytest.raises(cp.RunFailed, match="command not found: 'no-such-command-xyz'"):
        led.run(flow, run_id="r")
    with pytest.raises(cp.RunFailed):  # recorded: the same answer, nothing run
        led.run(flow, run_id="r")
    assert not (ws / ".git" / "crashproof-shell" / "runs").exists()
    led.close()


def test_a_timeout_kills_the_group_and_puts_the_workspace_back(ws: Path, tmp_path: Path) -> None:
    before = cp.Workspace(ws).fingerprint()
    pidfile = tmp_path / "grandchild.pid"
    shell = cp.Shell(ws)
    script = f"echo half > src/half.py; sleep 60 & echo $! > {pidfile}; wait"

    @cp.workflow("slow")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("cmd", shell, argv=["sh", "-c", script], timeout=1.5)

    led = ledger(tmp_path, flow)
    started = time.monotonic()
    with pytest.raises(cp.RunFailed, match=r"timed out after 1\.5 s"):
        led.run(flow, run_id="r")
    assert time.monotonic() - started < 30
    assert cp.Workspace(ws).fingerprint() == before
    grandchild = int(pidfile.read_text())
    for _ in range(100):  # the sleep in the background died with its group
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild)
    led.close()


def test_too_much_output_is_killed_like_a_timeout(ws: Path, tmp_path: Path) -> None:
    shell = cp.Shell(ws, max_output=1 << 20)

    @cp.workflow("flood")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("cmd", shell, argv=["sh", "-c", "echo x > src/x.py; yes"])

    led = ledger(tmp_path, flow)
    with pytest.raises(cp.RunFailed, match="printed more than 1048576 bytes"):
        led.run(flow, run_id="r")
    assert not (ws / "src" / "x.py").exists()
    assert not list((ws / ".git" / "crashproof-shell" / "runs").glob("*.out"))
    led.close()


def test_the_ledger_key_never_reaches_the_command(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHPROOF_KEY_FILE", "/secret/key")
    shell = cp.Shell(ws, env={"FROM_TOOL": "1"})

    @cp.workflow("env")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("cmd", shell, argv=["env"], env={"FROM_ACT": "2"})

    led = ledger(tmp_path, flow)
    shown = shell.output(led.run(flow, run_id="r")["stdout"]["blob"]).decode()
    assert "CRASHPROOF_" not in shown
    assert "FROM_TOOL=1" in shown
    assert "FROM_ACT=2" in shown
    led.close()


def test_the_policy_allow_lists_commands_by_argv_pattern(ws: Path, tmp_path: Path) -> None:
    shell = cp.Shell(ws)
    policy = cp.Policy("1", allow={"shell": "1"}, scopes={"shell": {"command": ["echo *"]}})

    @cp.workflow("policed")
    def flow(ctx: cp.Context) -> Any:
        ok = ctx.act("echo", shell, argv=["echo", "hello world"])
        try:
            ctx.act("rm", shell, argv=["rm", "-rf", "src"])
        except cp.PolicyViolation as exc:
            return [ok["stdout"]["head"], str(exc)]
        return None

    led = ledger(tmp_path, flow)
    head, refusal = led.run(flow, run_id="r", options=cp.RunOptions(policy=policy))
    assert head == "hello world\n"
    assert "command 'rm -rf src' is outside the shell scope ['echo *']" in refusal
    assert (ws / "src" / "a.py").exists()
    led.close()


def test_an_external_command_left_in_flight_follows_its_declaration(
    ws: Path, tmp_path: Path
) -> None:
    """Cut short between its start and its receipt (the crash point after the command
    exited): a workspace command is put back and run again, an external one freezes for
    review by default, and is recorded as not done under at_most_once."""
    outside = tmp_path / "sent.log"
    results: dict[str, Any] = {}
    for effect, on_unknown in [
        ("workspace", cp.OnUnknown.REVIEW),
        ("external", cp.OnUnknown.REVIEW),
        ("external", cp.OnUnknown.AT_MOST_ONCE),
    ]:
        shell = cp.Shell(ws, on_unknown=on_unknown)
        run_id = f"{effect}-{on_unknown.value}"
        script = f"echo sent {run_id} >> {outside}; echo done >> src/a.py"

        @cp.workflow("inflight")
        def flow(
            ctx: cp.Context, effect: str = effect, shell: cp.Shell = shell, script: str = script
        ) -> Any:
            try:
                return ctx.act("cmd", shell, argv=["sh", "-c", script], effect=effect)
            except cp.ActNotDone as exc:
                return f"not done: {exc}"

        led = ledger(tmp_path, flow, crash_points=cp.CrashPoints(match="inside[act:cmd:exited]"))
        with pytest.raises(cp.SimulatedCrash):
            led.run(flow, run_id=run_id)
        led.close()
        again = ledger(tmp_path, flow)
        try:
            results[run_id] = again.resume(run_id)
        except cp.RunFrozen as exc:
            results[run_id] = f"frozen: {exc}"
        again.close()
    workspace_run = results["workspace-review"]
    assert workspace_run["exit_code"] == 0
    assert "external command 'sh' left no completion record" in results["external-review"]
    assert results["external-at_most_once"].startswith("not done")
    # The workspace command ran twice (the outside log shows it) but landed once.
    assert outside.read_text().count("sent") == 4
    assert (ws / "src" / "a.py").read_text().count("done") == 1 + 2  # + the two external


def test_an_async_workflow_runs_it_off_the_loop_and_a_cancel_kills_it(
    ws: Path, tmp_path: Path
) -> None:
    pidfile = tmp_path / "child.pid"
    shell = cp.Shell(ws)

    @cp.workflow("async-shell")
    async def flow(ctx: cp.AsyncContext) -> Any:
        script = f"echo $$ > {pidfile}; exec sleep 60"
        return await ctx.act("cmd", shell, argv=["sh", "-c", script])

    async def main() -> int:
        led = ledger(tmp_path, flow)
        task = asyncio.create_task(led.run_async(flow, run_id="r"))
        ticks = 0
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.02)  # the loop keeps running while the command does
            ticks += 1
        pid = int(pidfile.read_text())
        task.cancel()
        with pytest.raises((asyncio.CancelledError, cp.DriveCancelled)):
            await task
        led.close()
        for _ in range(100):
            if not _alive(pid):
                break
            await asyncio.sleep(0.05)
        assert not _alive(pid)
        return ticks

    assert asyncio.run(main()) >= 1


def _alive(pid: int) -> bool:
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_text.rpartition(")")[2].split()[0] != "Z"


def test_a_workspace_outside_git_needs_a_store_outside_it(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("a\n")
    with pytest.raises(ValueError, match="not a git working tree"):
        cp.Shell(plain)
    with pytest.raises(ValueError, match="must not be inside the workspace"):
        cp.Shell(plain, store=plain / "store")
    shell = cp.Shell(plain, store=tmp_path / "store")
    snap = shell.snapshots.snapshot([])
    (plain / "a.txt").write_text("changed\n")
    (plain / "b.txt").write_text("new\n")
    shell.snapshots.restore(snap, [])
    assert sorted(p.name for p in plain.iterdir()) == ["a.txt"]
    assert (plain / "a.txt").read_text() == "a\n"


@pytest.mark.parametrize(
    "point",
    [
        "after_commit[step_done:fmt]",  # the command recorded: its delta names the file
        "inside[act:fmt:exited]",  # it ran, no record: its snapshot is put back
        "inside[act:fmt:recorded]",  # its completion record, no receipt yet
    ],
)
def test_a_command_that_rewrote_a_file_a_workspace_act_wrote_supersedes_it(
    ws: Path, tmp_path: Path, point: str
) -> None:
    """A formatter rewriting the file an edit wrote: on resume the edit's receipt (the
    file holds its result) is superseded by the command, not drifted (which froze it)."""
    workspace = cp.Workspace(ws)
    shell = cp.Shell(workspace)

    @cp.workflow("formatted")
    def flow(ctx: cp.Context) -> Any:
        ctx.act("edit", workspace, op="write", path="src/a.py", content="a = 'x'\n")
        ctx.act("fmt", shell, argv=["sed", "-i", "s/'/\"/g", "src/a.py"])
        return ctx.act("after", workspace, op="write", path="src/z.py", content="z\n")

    crashing = ledger(tmp_path, flow, crash_points=cp.CrashPoints(match=point))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow, run_id="r")
    crashing.close()
    led = ledger(tmp_path, flow)
    led.run(flow, run_id="r")
    assert (ws / "src" / "a.py").read_text() == 'a = "x"\n'
    assert (ws / "src" / "z.py").read_text() == "z\n"
    checks = {c.step: c for c in led.reconcile("r", [workspace, shell])}
    assert checks["edit"].status == "confirmed"
    assert f"superseded by 'fmt' on {workspace.root / 'src' / 'a.py'}" in checks["edit"].detail
    led.close()


def test_a_file_changed_after_the_command_that_superseded_its_edit_still_freezes(
    ws: Path, tmp_path: Path
) -> None:
    """Superseded is not unchecked: a change made to that file while the run was down is
    seen by the resume's observation of the workspace."""
    workspace = cp.Workspace(ws)
    shell = cp.Shell(workspace)

    @cp.workflow("formatted")
    def flow(ctx: cp.Context) -> Any:
        ctx.act("edit", workspace, op="write", path="src/a.py", content="a = 'x'\n")
        ctx.act("fmt", shell, argv=["sed", "-i", "s/'/\"/g", "src/a.py"])
        return ctx.act("after", workspace, op="write", path="src/z.py", content="z\n")

    crash = cp.CrashPoints(match="after_commit[step_done:fmt]")
    crashing = ledger(tmp_path, flow, crash_points=crash)
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow, run_id="r")
    crashing.close()
    (ws / "src" / "a.py").write_text("a = 'someone else'\n")
    led = ledger(tmp_path, flow)
    with pytest.raises(cp.RunFrozen):
        led.run(flow, run_id="r")
    assert not (ws / "src" / "z.py").exists()
    led.close()


def test_a_command_whose_runner_died_before_its_marker_never_runs(tmp_path: Path) -> None:
    """The window between a command's spawn and its marker: a runner killed there closes
    the gate's pipe without the go-ahead, and the command is never run (a recovery could
    not have found it to kill it before restoring the workspace)."""
    from crashproof.tools import _process

    target = tmp_path / "ran"
    proc = subprocess.Popen([*_process._GATE, "touch", str(target)], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.close()  # as the pipe of a runner SIGKILLed before writing the marker
    assert proc.wait(timeout=10) != 0
    assert not target.exists()
    gated = subprocess.run([*_process._GATE, "touch", str(target)], input=b"go\n", timeout=10)
    assert gated.returncode == 0  # the go-ahead runs it
    assert target.exists()


def test_a_store_whose_git_init_a_crash_cut_short_is_made_again(ws: Path) -> None:
    """A kill inside the store's ``git init`` leaves a HEAD and no refs/ or objects/ yet
    (git: "not a git repository"): the next snapshot initialises it again, never fails
    on it for ever after (a chaos trial's recovery did: its run recorded as failed)."""
    path = ws / ".git" / "crashproof-shell"
    path.mkdir()
    (path / "HEAD").write_text("ref: refs/heads/main\n")  # as a cut-short init left it
    (path / "runs").mkdir()  # a command's spool, made beside it
    before = cp.Workspace(ws).fingerprint()
    store = SnapshotStore(ws, path)
    snap = store.snapshot([])
    (ws / "src" / "a.py").write_text("a = 2\n")
    store.restore(snap, [])
    assert cp.Workspace(ws).fingerprint() == before
