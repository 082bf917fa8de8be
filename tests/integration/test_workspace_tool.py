"""The Workspace tool on real files: state-addressed ops, drift, atomic writes, and the
documented fingerprint format (recomputed here with the shell recipe of its docstring)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import crashproof as cp

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
