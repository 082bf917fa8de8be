"""A file that is not a usable ledger is refused with a clear error, and left untouched."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.store.sqlite import SCHEMA_VERSION


def snapshot(path: Path) -> dict[str, str]:
    """sha256 of the database and of its WAL and shared-memory companions.

    An absent and an empty companion count as the same: opening may create an
    empty ``-wal``, which holds no data.
    """

    def digest(p: Path) -> str:
        data = p.read_bytes() if p.exists() else b""
        return hashlib.sha256(data).hexdigest()

    return {
        "db": digest(path),
        "wal": digest(path.with_name(path.name + "-wal")),
    }


@contextlib.contextmanager
def unchanged(path: Path) -> Iterator[None]:
    before = snapshot(path)
    yield
    assert snapshot(path) == before, f"{path} was modified"


def real_ledger(path: Path, runs: int = 6) -> Path:
    """A closed ledger holding several finished runs with large values."""

    @cp.workflow("filler")
    def filler(ctx: cp.Context, i: int) -> list[str]:
        return [ctx.step(f"s{j}", lambda j=j: f"{i}-{j}-" + "z" * 3000) for j in range(4)]

    with cp.Ledger(f"sqlite:///{path}") as ledger:
        for i in range(runs):
            ledger.run(filler, run_id=f"run-{i}", i=i)
    if path.with_name(path.name + "-wal").exists():
        raise AssertionError("closing a ledger must checkpoint and remove its WAL")
    return path


def open_fails(path: Path) -> cp.CrashproofError:
    with unchanged(path), pytest.raises(cp.CrashproofError) as caught:
        cp.Ledger(f"sqlite:///{path}")
    message = str(caught.value)
    assert str(path) in message
    assert "nothing was changed" in message
    return caught.value


def test_a_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("These are my notes, not a database.\n" * 20)
    error = open_fails(path)
    assert isinstance(error, cp.NotALedger)


def test_a_tiny_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.db"
    path.write_bytes(b"SQLite")
    assert isinstance(open_fails(path), cp.NotALedger)


def test_a_truncated_ledger(tmp_path: Path) -> None:
    original = real_ledger(tmp_path / "good.db")
    path = tmp_path / "truncated.db"
    shutil.copy(original, path)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    error = open_fails(path)
    assert isinstance(error, cp.IntegrityError)
    assert "truncated" in str(error)
    assert "backup" in str(error)


def test_a_ledger_another_process_is_still_writing_opens_once_written(tmp_path: Path) -> None:
    # Another process creating the ledger (or checkpointing it as it closes) writes the
    # header first and the pages after it: a look in between is no truncation.
    whole = real_ledger(tmp_path / "good.db").read_bytes()
    page_size = int.from_bytes(whole[16:18], "big")
    if len(whole) < 2 * page_size:
        pytest.skip("the ledger fits in one page")
    path = tmp_path / "being-written.db"
    path.write_bytes(whole[:page_size])
    rest = threading.Timer(0.3, lambda: path.write_bytes(whole))
    rest.start()
    try:
        cp.Ledger(f"sqlite:///{path}").close()  # refused as truncated before it settled
    finally:
        rest.join()


def test_a_ledger_with_a_corrupt_page(tmp_path: Path) -> None:
    path = real_ledger(tmp_path / "corrupt.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()
    with path.open("r+b") as f:  # clobber the root page of the runs table
        f.seek((root[0] - 1) * page_size)
        f.write(b"\xff" * page_size)

    with (
        unchanged(path),
        pytest.raises(cp.IntegrityError) as caught,
        cp.Ledger(f"sqlite:///{path}") as ledger,
    ):
        ledger.runs()
    assert str(path) in str(caught.value)
    assert "backup" in str(caught.value)


def test_a_database_of_another_application(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada'), ('grace')")
        conn.commit()
    error = open_fails(path)
    assert isinstance(error, cp.NotALedger)
    assert "users" in str(error)


def test_a_wal_database_of_another_application(tmp_path: Path) -> None:
    path = tmp_path / "app-wal.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT)")
        conn.commit()
    assert isinstance(open_fails(path), cp.NotALedger)


def test_a_ledger_from_a_newer_crashproof(tmp_path: Path) -> None:
    path = real_ledger(tmp_path / "future.db", runs=2)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE crashproof_meta SET value = '999' WHERE key = 'schema_version'")
        conn.commit()
    error = open_fails(path)
    assert isinstance(error, cp.SchemaTooNew)
    assert (error.found, error.supported) == (999, SCHEMA_VERSION)
    assert "999" in str(error)
    assert f"up to {SCHEMA_VERSION}" in str(error)
    assert "Upgrade crashproof" in str(error)


def test_a_directory(tmp_path: Path) -> None:
    with pytest.raises(cp.NotALedger):
        cp.Ledger(f"sqlite:///{tmp_path}")


def test_a_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "runs.db"
    with pytest.raises(cp.LedgerError, match="does not exist"):
        cp.Ledger(f"sqlite:///{path}")
    assert not path.parent.exists()


def test_the_good_ledger_still_opens_and_reads(tmp_path: Path) -> None:
    path = real_ledger(tmp_path / "good.db")
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        runs = ledger.runs()
    assert [r.run_id for r in runs] == [f"run-{i}" for i in range(6)]
    assert all(r.status is cp.RunStatus.SUCCEEDED for r in runs)


def _live_wal(tmp_path: Path) -> tuple[bytes, sqlite3.Connection]:
    """A WAL as SQLite writes it: three commits, the connection kept open (no checkpoint)."""
    conn = sqlite3.connect(tmp_path / "w.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (v TEXT)")
    for i in range(3):
        conn.execute("INSERT INTO t VALUES (?)", ("v" * 5000 + str(i),))
    return (tmp_path / "w.db-wal").read_bytes(), conn


def test_wal_pages_follow_sqlite_s_own_recovery_rules(tmp_path: Path) -> None:
    """Frames count up to the last commit whose salts and running checksum verify: a
    torn frame ends the WAL there, as SQLite's recovery ends it."""
    from crashproof.store.sqlite_file import wal_pages

    data, conn = _live_wal(tmp_path)
    try:
        page_count = conn.execute("PRAGMA page_count").fetchone()[0]
    finally:
        conn.close()
    copy = tmp_path / "copy-wal"
    copy.write_bytes(data)
    found = wal_pages(copy, 4096)
    assert found is not None
    assert found[1] == page_count  # the size the last commit set
    assert set(range(1, page_count + 1)) <= found[0]
    frame = 24 + 4096
    frames = (len(data) - 32) // frame
    torn = bytearray(data)
    torn[32 + (frames - 1) * frame + 24 + 100] ^= 0xFF  # a byte of the last frame's page
    copy.write_bytes(bytes(torn))
    earlier = wal_pages(copy, 4096)
    assert earlier is not None
    assert earlier[1] <= found[1]
    assert len(earlier[0]) <= len(found[0])
    assert earlier != found
    stale = bytearray(data)
    stale[32 + 8] ^= 0xFF  # the first frame's salt: a WAL from before a restart
    copy.write_bytes(bytes(stale))
    assert wal_pages(copy, 4096) == (set(), 0)
    assert wal_pages(copy, 8192) is None  # another page size: not this database's WAL
    assert wal_pages(tmp_path / "absent-wal", 4096) is None
