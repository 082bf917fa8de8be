"""The Workspace tool on real files: state-addressed ops, drift, atomic writes, and the
documented fingerprint format (recomputed here with the shell recipe of its docstring)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

from .disks import ext4_on_loop_at, fail_block_writes, fill

SHELL_FINGERPRINT = r"""
find . -type f ! -path './.git/*' ! -name '*.crashproof-*.tmp' | sed 's|^\./||' \
  | LC_ALL=C sort | while IFS= read -r f; do
      printf '%s\0%s\0%s\n' "$f" "$(sha256sum < "$f" | cut -d' ' -f1)" \
             "$([ -x "$f" ] && echo x || echo -)"; done | sha256sum | cut -d' ' -f1
"""

DIFF = """--- a/app.py
+++ b/app.py
@@ -1,3 +1,3 @@
 import os
-VERSION = "1.0"
+VERSION = "2.0"
 print(VERSION)
"""


def ledger(tmp_path: Path) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")


@pytest.fixture
def ws(tmp_path: Path) -> cp.Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    return cp.Workspace(root)


def test_write_patch_append_delete(tmp_path: Path, ws: cp.Workspace) -> None:
    @cp.workflow("edit", version="1")
    def edit(ctx: cp.Context) -> list[object]:
        out = [
            ctx.act(
                "w",
                ws,
                op="write",
                path="app.py",
                content='import os\nVERSION = "1.0"\nprint(VERSION)\n',
            )
        ]
        out.append(ctx.act("p", ws, op="patch", path="app.py", diff=DIFF))
        out.append(ctx.act("a", ws, op="append", path="sub/notes.md", text="hello\n"))
        out.append(ctx.act("tmp", ws, op="write", path="scratch.txt", content="x"))
        out.append(ctx.act("d", ws, op="delete", path="scratch.txt"))
        return out

    results = ledger(tmp_path).run(edit, run_id="r")
    assert (ws.root / "app.py").read_text() == 'import os\nVERSION = "2.0"\nprint(VERSION)\n'
    assert (ws.root / "sub/notes.md").read_text() == "hello\n"
    assert not (ws.root / "scratch.txt").exists()
    assert results[-1] == {"path": "scratch.txt", "sha256": "absent"}


def test_patch_that_does_not_apply_fails_before_any_effect(tmp_path: Path, ws: cp.Workspace):
    (ws.root / "app.py").write_text("something else\n")

    @cp.workflow("bad-patch", version="1")
    def bad(ctx: cp.Context) -> str:
        try:
            ctx.act("p", ws, op="patch", path="app.py", diff=DIFF)
        except cp.ActFailed as exc:
            return str(exc)
        return "applied"

    message = ledger(tmp_path).run(bad, run_id="r")
    assert "patch does not apply" in message
    assert (ws.root / "app.py").read_text() == "something else\n"


def test_paths_outside_the_workspace_are_refused(tmp_path: Path, ws: cp.Workspace) -> None:
    @cp.workflow("escape", version="1")
    def escape(ctx: cp.Context, path: str) -> str:
        try:
            ctx.act("w", ws, op="write", path=path, content="x")
        except cp.ActFailed as exc:
            return str(exc)
        return "written"

    for n, path in enumerate(["../evil.txt", "/etc/evil", ".git/config"]):
        assert "leaves the workspace" in ledger(tmp_path).run(escape, run_id=f"r{n}", path=path)
    assert not (tmp_path / "evil.txt").exists()


def test_drift_between_intent_and_execute_freezes(tmp_path: Path, ws: cp.Workspace) -> None:
    (ws.root / "a.txt").write_text("base\n")

    @cp.workflow("drift", version="1")
    def drift(ctx: cp.Context) -> object:
        return ctx.act("w", ws, op="append", path="a.txt", text="more\n")

    points = cp.CrashPoints(match="after_commit[act_intent:w]")
    crashy = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        crashy.run(drift, run_id="r")
    (ws.root / "a.txt").write_text("someone else edited this\n")  # drift while we were down
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger(tmp_path).run(drift, run_id="r")
    assert "drifted" in frozen.value.reason
    assert (ws.root / "a.txt").read_text() == "someone else edited this\n"  # not forced
    info = ledger(tmp_path).get_run("r")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert info.evidence is not None
    # Caught before the lookup runs: the re-observed workspace is neither the state the
    # intent recorded nor the one it expected (runtime/steps/environment.py).
    assert info.evidence["environments"][0]["change"] == "state"


def test_temp_file_left_by_a_crash_is_removed_by_lookup(tmp_path: Path, ws: cp.Workspace):
    @cp.workflow("one", version="1")
    def one(ctx: cp.Context) -> object:
        return ctx.act("w", ws, op="write", path="f.txt", content="data\n")

    points = cp.CrashPoints(match="inside[act:w:written]")
    with pytest.raises(cp.SimulatedCrash):
        cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points).run(one, run_id="r")
    leftovers = [p.name for p in ws.root.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1
    assert not (ws.root / "f.txt").exists()
    ledger(tmp_path).run(one, run_id="r")
    assert sorted(p.name for p in ws.root.iterdir()) == ["f.txt"]
    assert (ws.root / "f.txt").read_text() == "data\n"


def test_fingerprint_matches_the_documented_shell_recipe(ws: cp.Workspace) -> None:
    (ws.root / "b.txt").write_text("bee\n")
    (ws.root / "a dir").mkdir()
    (ws.root / "a dir" / "z.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(ws.root / "a dir" / "z.sh", 0o755)
    (ws.root / "ünï.txt").write_text("unicode name\n")
    (ws.root / ".git").mkdir()
    (ws.root / ".git" / "HEAD").write_text("ignored\n")
    (ws.root / ".x.crashproof-0123456789abcdef.tmp").write_text("ignored\n")
    shell = subprocess.run(
        ["bash", "-c", SHELL_FINGERPRINT], cwd=ws.root, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert ws.fingerprint() == shell
    assert len(shell) == 64
    before = ws.fingerprint()
    os.chmod(ws.root / "a dir" / "z.sh", 0o644)  # the executable bit counts
    assert ws.fingerprint() != before
    assert ws.fingerprint(include=["*.txt"]) != ws.fingerprint()
    assert ws.fingerprint(exclude=["a dir/*"]) == ws.fingerprint(include=["*.txt"])


def test_a_path_that_cannot_name_a_file_is_the_acts_recorded_failure(
    tmp_path: Path, ws: cp.Workspace
) -> None:
    """A directory, a path through a file, a name too long, a symlink loop, a NUL byte,
    the root itself: the act's own bad argument, a clean cp.PermanentError saying what
    to do, recorded as its failure (the workflow goes on); a raw IsADirectoryError...
    escaped before and failed the run."""
    (ws.root / "src").mkdir()
    (ws.root / "a.txt").write_text("a\n")
    (ws.root / "loop1").symlink_to("loop2")
    (ws.root / "loop2").symlink_to("loop1")
    cases = {
        "dir": ({"op": "write", "path": "src", "content": "x"}, "names a directory"),
        "dir-delete": ({"op": "delete", "path": "src"}, "names a directory"),
        "dir-patch": ({"op": "patch", "path": "src", "diff": DIFF}, "names a directory"),
        "through-file": (
            {"op": "write", "path": "a.txt/b", "content": "x"},
            "goes through a file where a directory should be",
        ),
        "too-long": ({"op": "append", "path": "d/" + "y" * 300, "text": "x"}, "too long"),
        "loop": ({"op": "write", "path": "loop1/x", "content": "x"}, "symlink loop"),
        "nul": ({"op": "write", "path": "a\0b", "content": "x"}, "NUL byte"),
        "root": ({"op": "write", "path": ".", "content": "x"}, "the workspace itself"),
    }

    @cp.workflow("bad-paths", version="1")
    def bad(ctx: cp.Context) -> dict[str, str]:
        out = {}
        for key, (params, _) in cases.items():
            try:
                ctx.act(key, ws, **params)
            except cp.ActFailed as exc:
                out[key] = str(exc)
        return out

    before = ws.fingerprint()
    led = ledger(tmp_path)
    out = led.run(bad, run_id="r")
    assert sorted(out) == sorted(cases)
    for key, (_, said) in cases.items():
        assert said in out[key], key
        assert "\n" not in out[key]  # one line, no traceback
    assert "name a file" in out["dir"]  # what to do
    info = led.get_run("r")
    assert info.status is cp.RunStatus.SUCCEEDED
    assert {s.key: s.status for s in info.steps} == dict.fromkeys(cases, cp.StepStatus.FAILED)
    assert ws.fingerprint() == before
    led.close()


@pytest.mark.parametrize(
    ("fault", "error"), [("full", "No space left on device"), ("ro", "Read-only file system")]
)
def test_a_disk_that_fails_under_a_write_stops_the_run_resumable(
    small_disk: Path, tmp_path: Path, fault: str, error: str
) -> None:
    """The workspace on a real 8 MiB tmpfs without room for the file (ENOSPC writing its
    temp copy), or remounted read-only (EROFS): the file untouched, nothing recorded as
    the act's result, the run stops resumable (before: an unknown outcome looked up
    three times, then needs_review). With the disk back, the resume writes it once, as a
    run on a sound disk did."""

    big = "".join(f"{i:07d}\n" for i in range(256 * 1024))  # 2 MiB

    def make(root: Path) -> cp.Workflow[Any]:
        root.mkdir()
        (root / "notes.txt").write_text("base\n")
        workspace = cp.Workspace(root)

        @cp.workflow("disk-full-write", version="1")
        def flow(ctx: cp.Context) -> Any:
            first = ctx.act("notes", workspace, op="append", path="notes.txt", text="more\n")
            return [first, ctx.act("big", workspace, op="write", path="out/big.txt", content=big)]

        return flow

    root = small_disk / "ws"
    flow = make(root)
    (root / "out").mkdir()  # made before the fault: a read-only disk cannot make it

    def break_disk(_: str) -> None:  # once the first act is done
        if fault == "full":
            fill(small_disk, 1 << 20)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)

    points = cp.CrashPoints(match="after_commit[step_done:notes]", action=break_disk)
    led = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points)
    with pytest.raises(cp.RunStopped) as stopped:
        led.run(flow, run_id="r")
    led.close()
    led = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")  # a restarted process
    led.register(flow)
    assert stopped.value.reason.startswith(
        f"unavailable:big: cp.Workspace could not write 'out/big.txt' (OSError: {error}), "
        "nothing was changed in this attempt; free or repair the disk under "
    )
    assert led.get_run("r").status is cp.RunStatus.STOPPED
    kinds = [e.type.value for e in led.journal("r") if e.key == "big"]
    assert "step_done" not in kinds
    assert "act_unknown" not in kinds
    assert not (root / "out" / "big.txt").exists()
    assert [p.name for p in (root / "out").iterdir()] == []  # no temp file left
    if fault == "full":
        (small_disk / "filler").unlink()
    else:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    result = led.resume("r")
    assert led.get_run("r").status is cp.RunStatus.SUCCEEDED
    assert (root / "notes.txt").read_text() == "base\nmore\n"  # appended once
    assert (root / "out" / "big.txt").read_text() == big
    led.close()
    twin_flow = make(tmp_path / "twin")
    clean = cp.Ledger(f"sqlite:///{tmp_path / 'twin.db'}")
    assert clean.run(twin_flow, run_id="r") == result
    assert cp.Workspace(tmp_path / "twin").fingerprint() == cp.Workspace(root).fingerprint()
    clean.close()


@pytest.mark.parametrize("point", ["written", "renamed"])
def test_a_lookup_on_a_read_only_disk(small_disk: Path, tmp_path: Path, point: str) -> None:
    """A crash leaves act 'out' in flight (its temporary copy written, or renamed into
    place) and the workspace's tmpfs is remounted read-only before the resume. Renamed,
    the lookup has nothing to remove and answers on the read-only disk (before: unlink of
    the absent copy met EROFS, and so did the completed act's re-read). Written, the
    leftover copy cannot be removed: cp.Unavailable saying what to repair, a resumable
    stop with nothing recorded (before: a raw OSError); with the disk writable again the
    resume ends as a twin run that never faulted."""

    def make(root: Path) -> cp.Workflow[Any]:
        root.mkdir()
        (root / "notes.txt").write_text("base\n")
        workspace = cp.Workspace(root)

        @cp.workflow("lookup-ro", version="1")
        def flow(ctx: cp.Context) -> Any:
            first = ctx.act("notes", workspace, op="append", path="notes.txt", text="more\n")
            return [first, ctx.act("out", workspace, op="write", path="out.txt", content="x\n")]

        return flow

    root = small_disk / "ws"
    flow = make(root)
    points = cp.CrashPoints(match=f"inside[act:out:{point}]")
    with pytest.raises(cp.SimulatedCrash):
        cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points).run(flow, run_id="r")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    led = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")  # a restarted process
    led.register(flow)
    try:
        if point == "written":
            with pytest.raises(cp.RunStopped) as stopped:
                led.resume("r")
            reason = stopped.value.reason
            assert reason.startswith("unavailable:out: lookup unavailable (workspace failed")
            said = (
                "cp.Workspace could not remove the leftover temporary copy of 'out.txt' "
                "(OSError: Read-only file system) to look the act up; repair the disk under "
            )
            assert said in reason
            stop = [e for e in led.journal("r") if e.type.value == "run_stopped"][-1]
            errors = stop.payload["evidence"]["lookup_errors"]
            assert errors[-1]["type"] == "crashproof.errors.Unavailable"
            assert errors[-1]["message"] == f"{said}{root}, then resume"
            assert led.get_run("r").status is cp.RunStatus.STOPPED
            assert not (root / "out.txt").exists()
            kinds = [e.type.value for e in led.journal("r") if e.key == "out"]
            assert "step_done" not in kinds
            subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
        result = led.resume("r")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert led.get_run("r").status is cp.RunStatus.SUCCEEDED
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt", "out.txt"]
    assert (root / "notes.txt").read_text() == "base\nmore\n"
    led.close()
    twin = cp.Ledger(f"sqlite:///{tmp_path / 'twin.db'}")
    assert twin.run(make(tmp_path / "twin"), run_id="r") == result
    assert cp.Workspace(tmp_path / "twin").fingerprint() == cp.Workspace(root).fingerprint()
    twin.close()


def test_a_lookup_whose_path_no_longer_names_a_file(tmp_path: Path) -> None:
    """After a crash left two acts' intents in flight, a directory took the place of
    'a.txt' and a file the place of folder 'd' (left out of the observations, else the
    environment's check freezes first): kernel EISDIR and ENOTDIR in the lookup.
    A directory is neither the intent's base nor its result: drift, frozen for review.
    A path through a file holds no file: absent, the base of the write, so it is executed
    again and fails as a live one does, the act's recorded failure. Before, both were a
    raw OSError, looked up four times and stopped 'lookup unavailable' (resumed for ever
    by a worker, never answered)."""
    ws = cp.Workspace(tmp_path / "ws", observe_ignore=["d"])
    ws.root.mkdir()
    (ws.root / "d").mkdir()

    @cp.workflow("paths-gone", version="1")
    def flow(ctx: cp.Context) -> Any:
        try:
            ctx.act("deep", ws, op="write", path="d/f.txt", content="x\n")
        except cp.ActFailed as exc:
            failed = str(exc)
        return [failed, ctx.act("a", ws, op="write", path="a.txt", content="a\n")]

    def crashed(at: str) -> cp.Ledger:
        points = cp.CrashPoints(match=f"after_commit[act_intent:{at}]")
        led = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points)
        led.register(flow)
        return led

    with pytest.raises(cp.SimulatedCrash):
        crashed("deep").run(flow, run_id="r")
    (ws.root / "d").rmdir()
    (ws.root / "d").write_text("a file now\n")
    with pytest.raises(cp.SimulatedCrash):
        crashed("a").resume("r")
    (ws.root / "a.txt").mkdir()
    led = ledger(tmp_path)
    led.register(flow)
    with pytest.raises(cp.RunFrozen) as frozen:
        led.resume("r")
    assert "a.txt names a directory, not a file, neither the base absent nor the" in str(
        frozen.value
    )
    info = led.get_run("r")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    steps = {s.key: s for s in info.steps}
    assert steps["deep"].status is cp.StepStatus.FAILED
    kinds = [e.type.value for e in led.journal("r") if e.key == "deep"]
    assert kinds.count("act_intent") == 2  # looked up: absent, executed again
    led.close()


def test_a_directory_that_cannot_be_synced_after_the_rename_is_looked_up(tmp_path: Path) -> None:
    """The workspace on a real ext4 disk whose directory block cannot be written any more
    once the act's temporary copy is durable (its page of the loop device's image a hole
    on a full tmpfs): the rename lands in the kernel's cache, and fsync of the directory
    fails with EIO. The outcome is unknown (cp.OutcomeUnknown, recorded), and the lookup
    settles it in the same drive: the file holds the intent's result, so the receipt is
    the act's, written once, as a twin run on a sound disk wrote it."""

    def make(root: Path) -> cp.Workflow[Any]:
        root.mkdir()
        (root / "notes.txt").write_text("base\n")
        workspace = cp.Workspace(root)

        @cp.workflow("dir-sync", version="1")
        def flow(ctx: cp.Context) -> Any:
            first = ctx.act("notes", workspace, op="append", path="notes.txt", text="more\n")
            return [first, ctx.act("out", workspace, op="write", path="out.txt", content="x\n")]

        return flow

    with ext4_on_loop_at(tmp_path / "ext4", tmp_path / "backing") as disk:
        root = disk / "ws"
        flow = make(root)
        filled: list[Path] = []

        def break_disk(_: str) -> None:  # the temporary copy durable, the file untouched
            filled.append(fail_block_writes(root, tmp_path / "backing"))

        points = cp.CrashPoints(match="inside[act:out:written]", action=break_disk)
        led = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", crash_points=points)
        result = led.run(flow, run_id="r")
        assert filled, "the act's temporary copy was never written"
        assert led.get_run("r").status is cp.RunStatus.SUCCEEDED
        unknown = [e for e in led.journal("r") if e.key == "out" and e.type.value == "act_unknown"]
        assert len(unknown) == 1  # the sync's failure: unknown, then looked up
        error = unknown[0].payload["error"]
        assert error["type"] == "crashproof.errors.OutcomeUnknown"
        assert "'out.txt' changed but its directory could not be synced" in error["message"]
        assert "Input/output error" in error["message"]
        assert sorted(p.name for p in root.iterdir()) == ["notes.txt", "out.txt"]
        assert (root / "out.txt").read_text() == "x\n"
        fingerprint = cp.Workspace(root).fingerprint()
        led.close()
    twin = cp.Ledger(f"sqlite:///{tmp_path / 'twin.db'}")
    assert twin.run(make(tmp_path / "twin"), run_id="r") == result
    assert cp.Workspace(tmp_path / "twin").fingerprint() == fingerprint
    twin.close()
