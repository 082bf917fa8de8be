"""The forced sync of a SQLite ``-wal`` file keeps the file open between syncs, and
follows the name when the file is replaced or removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crashproof.store import syncing
from crashproof.store.syncing import WalSyncer


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes of the files fdatasync was called on (the OS call recorded, then made)."""
    inodes: list[int] = []
    real = syncing._datasync

    def record(fd: int) -> None:
        inodes.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(syncing, "_datasync", record)
    return inodes


def test_the_file_is_synced_through_one_descriptor(tmp_path: Path, synced: list[int]) -> None:
    db = tmp_path / "ledger.db"
    wal = tmp_path / "ledger.db-wal"
    wal.write_bytes(b"frames")
    syncer = WalSyncer(db)
    opened = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").exists() else None
    for _ in range(3):
        syncer()
    assert synced == [wal.stat().st_ino] * 3
    if opened is not None:  # one descriptor held, not one per sync
        assert len(os.listdir("/proc/self/fd")) == opened + 1
    syncer.close()
    syncer.close()  # twice is harmless


def test_a_replaced_file_is_opened_again_and_synced(tmp_path: Path, synced: list[int]) -> None:
    db = tmp_path / "ledger.db"
    wal = tmp_path / "ledger.db-wal"
    wal.write_bytes(b"old frames")
    syncer = WalSyncer(db)
    syncer()
    old = wal.stat().st_ino
    wal.unlink()
    wal.write_bytes(b"new frames")  # a new file (the old one is still held open)
    new = wal.stat().st_ino
    assert new != old
    syncer()
    syncer()
    assert synced == [old, new, new]
    syncer.close()


def test_a_removed_file_needs_no_sync(tmp_path: Path, synced: list[int]) -> None:
    db = tmp_path / "ledger.db"
    wal = tmp_path / "ledger.db-wal"
    syncer = WalSyncer(db)
    syncer()  # never existed: nothing to sync
    wal.write_bytes(b"frames")
    syncer()
    wal.unlink()  # checkpointed and removed by SQLite
    syncer()
    assert synced == [synced[0]]
    syncer.close()
