"""What a real machine does to a SQLite ledger after a crash (#26 items 2 and 3), each with
a documented outcome and a ledger that works again once the fault is gone:

- a disk that filled up mid-checkpoint leaves the file shorter than its header says,
  with every page still in the ``-wal``: SQLite reads it all, so the ledger opens, and
  the run resumes once there is space (a file whose pages are really gone stays refused);
- a ``-wal`` deleted or truncated after a crash loses the runs it held: ``check``,
  ``show`` and ``resume`` report them lost (``JournalRolledBack``, exit 5) for every run
  the witness saw, never "0 problems" or "no run", and ``run`` will not start the id
  again.
"""

from __future__ import annotations

import sqlite3
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.cli import ExitCode, main

FLOW = """
import os
import crashproof as cp


@cp.workflow("faulty", version="1")
def faulty(ctx):
    ws = cp.Workspace(os.environ["FAULT_WS"])
    for i in range(int(os.environ.get("FAULT_ACTS", "3"))):
        ctx.act(f"a{i}", ws, op="append", path="f.txt", text=f"line {i}\\n")
        ctx.step(f"s{i}", lambda i=i: "x" * 1500)
    if os.environ.get("FAULT_DIE"):
        os._exit(9)  # no checkpoint, no close: the WAL holds the run
    return "done"
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "faulty_flow.py").write_text(FLOW)
    (tmp_path / "ws").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAULT_WS", str(tmp_path / "ws"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "faulty_flow", raising=False)
    return tmp_path


def killed_mid_run(project: Path, db: Path, acts: int = 3) -> None:
    """A child runs the flow and dies without closing: the run lives in the -wal."""
    env = {"FAULT_DIE": "1", "FAULT_ACTS": str(acts)}
    code = textwrap.dedent(
        f"""
        import os, sys
        os.environ.update({env!r})
        sys.path.insert(0, {str(project)!r})
        from crashproof.cli import main
        main(["run", "faulty_flow:faulty", "--run-id", "r", "--db", "sqlite:///{db}"])
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=project, timeout=60, check=False)
    assert done.returncode == 9
    assert wal(db).stat().st_size > 0


def wal(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


def cli(*argv: str) -> int:
    return main(list(argv))


def events_in(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def checkpoint_met_a_full_disk(db: Path) -> None:
    """The state a checkpoint leaves when the disk fills up under it (as measured on a
    400 KiB tmpfs): page 1 copied back from the WAL, promising every page, and the file
    not extended; the WAL keeps every frame."""
    page_size = struct.unpack(">I", wal(db).read_bytes()[8:12])[0]
    data = wal(db).read_bytes()
    newest_page_1 = None
    for offset in range(32, len(data) - 24 - page_size + 1, 24 + page_size):
        if struct.unpack(">I", data[offset : offset + 4])[0] == 1:
            newest_page_1 = data[offset + 24 : offset + 24 + page_size]
    assert newest_page_1 is not None
    db.write_bytes(newest_page_1)


def test_a_disk_full_checkpoint_leaves_a_ledger_that_opens_and_resumes(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = project / "l.db"
    killed_mid_run(project, db)
    recorded = events_in(db)
    checkpoint_met_a_full_disk(db)
    promised = struct.unpack(">I", db.read_bytes()[28:32])[0] * 4096
    assert db.stat().st_size < promised  # shorter than its header says
    capsys.readouterr()
    assert cli("check", "--db", f"sqlite:///{db}") == ExitCode.OK, capsys.readouterr().err
    assert "0 with problems" in capsys.readouterr().out
    assert cli("resume", "r", "--app", "faulty_flow", "--db", f"sqlite:///{db}") == ExitCode.OK
    assert events_in(db) > recorded
    assert (project / "ws" / "f.txt").read_text().count("\n") == 3  # every act once
    assert cli("check", "--db", f"sqlite:///{db}") == ExitCode.OK


def test_a_file_whose_pages_are_gone_everywhere_is_still_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = project / "l.db"
    killed_mid_run(project, db)
    checkpoint_met_a_full_disk(db)
    wal(db).write_bytes(b"")  # the pages were only in the WAL
    before = db.read_bytes()
    capsys.readouterr()
    assert cli("runs", "--db", f"sqlite:///{db}") == ExitCode.LEDGER_UNUSABLE
    err = capsys.readouterr().err
    assert "is truncated" in err
    assert "Restore it from a backup" in err
    assert db.read_bytes() == before


@pytest.mark.parametrize("fault", ["deleted", "truncated"])
def test_a_lost_wal_is_reported_lost_never_all_clear(
    project: Path, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    db = project / "l.db"
    killed_mid_run(project, db)
    if fault == "deleted":
        wal(db).unlink()
    else:
        wal(db).write_bytes(b"")
    db.with_name(db.name + "-shm").unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    capsys.readouterr()
    assert cli("check", "--db", url) == ExitCode.LEDGER_UNUSABLE
    out = capsys.readouterr().out
    assert "CORRUPT   r: JournalRolledBack" in out
    assert "lost from the journal" in out
    assert "1 run(s) checked, 1 with problems" in out
    for argv in (("resume", "r", "--app", "faulty_flow"), ("show", "r"), ("check", "r")):
        assert cli(*argv, "--db", url) == ExitCode.LEDGER_UNUSABLE, argv
        shown = capsys.readouterr()
        assert "lost from the journal" in shown.out + shown.err, argv
    # Starting the id again is refused before anything is written.
    assert cli("run", "faulty_flow:faulty", "--run-id", "r", "--db", url) == (
        ExitCode.LEDGER_UNUSABLE
    )
    assert "lost from the journal" in capsys.readouterr().err
    assert events_in(db) == 0
    assert (project / "ws" / "f.txt").read_text().count("\n") == 3  # nothing re-done


def test_a_run_started_but_never_committed_is_not_reported(tmp_path: Path) -> None:
    """The witness row (generation 0) written before a first commit that never came: no
    record was lost, so nothing is reported."""
    db = tmp_path / "l.db"
    with cp.Ledger(f"sqlite:///{db}") as ledger:
        assert ledger.check() == []
        ledger.witness.start("never")  # type: ignore[union-attr]
        assert ledger.check() == []
        with pytest.raises(cp.RunNotFound):
            ledger.get_run("never")


def test_a_full_disk_for_real(project: Path, tmp_path: Path) -> None:
    """ENOSPC on a small tmpfs (mounting one needs root; skipped otherwise): the run stops
    cleanly, and once space is freed the same files open, check clean, and resume to the
    end with every act done once."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.decode().strip()}")
    try:
        # Leave 600 KiB: 40 acts need about twice that.
        filler = mount / "filler"
        filler.write_bytes(b"\0" * (4 * 1024 * 1024 - 600 * 1024))
        (mount / "ws").mkdir()
        db, url = mount / "l.db", f"sqlite:///{mount / 'l.db'}"
        env = {"FAULT_WS": str(mount / "ws"), "FAULT_ACTS": "40"}
        stopped = child(project, env, "run", "faulty_flow:faulty", "--run-id", "r", "--db", url)
        assert stopped.returncode == ExitCode.LEDGER_UNUSABLE, stopped.stderr
        assert "disk is full" in stopped.stderr
        filler.unlink()  # the fault is gone
        checked = child(project, env, "check", "--db", url)
        assert checked.returncode == ExitCode.OK, checked.stderr + checked.stdout
        resumed = child(project, env, "resume", "r", "--app", "faulty_flow", "--db", url)
        assert resumed.returncode == ExitCode.OK, resumed.stderr
        lines = (mount / "ws" / "f.txt").read_text().splitlines()
        assert lines == [f"line {i}" for i in range(40)]  # each act exactly once
        assert child(project, env, "check", "--db", url).returncode == ExitCode.OK
        assert db.exists()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def child(project: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own (the disk fills up under it)."""
    code = textwrap.dedent(
        f"""
        import os, sys
        os.environ.update({env!r})
        sys.path.insert(0, {str(project)!r})
        from crashproof.cli import main
        sys.exit(main({list(argv)!r}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


IMMUTABLE_FLOW = """
import subprocess, sys
import crashproof as cp


def freeze_files(db):
    files = [db, db + "-wal", db + "-shm"]
    subprocess.run(["chattr", "+i", *files], check=True)
    return "frozen"


@cp.workflow("immutable", version="1")
def immutable(ctx, db):
    for i in range(5):
        ctx.step(f"a{i}", lambda: "x" * 3000)
    ctx.step("freeze", freeze_files, db)
    for i in range(200):
        ctx.step(f"b{i}", lambda: "y" * 3000)
    return "done"
"""


def test_files_made_immutable_mid_run_end_in_one_line_not_silence(tmp_path: Path) -> None:
    """#26 item 4: SQLite's next write to its -shm map meets SIGBUS; the CLI process says
    so in one line plus a hint (exit 135, documented) instead of dying silently, and the
    run resumes once the files are writable again."""
    db = tmp_path / "l.db"
    files = [str(db), f"{db}-wal", f"{db}-shm"]
    probe = tmp_path / "probe"
    probe.write_text("")
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i does not work here (needs root and ext4, xfs or btrfs)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    (tmp_path / "immutable_flow.py").write_text(IMMUTABLE_FLOW)
    argv = [sys.executable, "-m", "crashproof", "run", "immutable_flow:immutable"]
    argv += ["--run-id", "r", "--arg", f"db={db}", "--db", f"sqlite:///{db}"]
    try:
        died = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        subprocess.run(["chattr", "-i", *files], capture_output=True, check=False)
    assert died.returncode == 135, died.stderr
    lines = died.stderr.splitlines()
    assert lines[0].startswith("crashproof: error: the process received SIGBUS")
    assert lines[1].startswith("hint: make the ledger's files writable again")
    assert len(lines) == 2
    assert cli("check", "--db", f"sqlite:///{db}") == ExitCode.OK
