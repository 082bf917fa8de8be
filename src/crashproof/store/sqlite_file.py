"""Checks of a SQLite ledger file made before SQLite opens it (and may write to it), and
the switch of a file to WAL mode (the ledger's and its witness')."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from crashproof.errors import IntegrityError, LedgerError, NotALedger

__all__ = ["check_file", "enter_wal"]

_HEADER = b"SQLite format 3\x00"


def check_file(path: Path) -> None:
    """Refuse files that are not SQLite databases, or are shorter than their header says,
    before SQLite gets a chance to write anything to them."""
    if not path.exists():
        if not path.parent.is_dir():
            raise LedgerError(
                f"cannot create ledger {path}: directory {path.parent} does not exist"
            )
        return
    if not path.is_file():
        raise NotALedger(f"{path} is not a file")
    size = path.stat().st_size
    if size == 0:
        return  # an empty file is an empty database; it becomes a new ledger
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_HEADER):
        raise NotALedger(
            f"{path} is not a crashproof ledger (not a SQLite database); nothing was changed"
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    change_counter = int.from_bytes(header[24:28], "big")
    page_count = int.from_bytes(header[28:32], "big")
    valid_for = int.from_bytes(header[92:96], "big")
    if valid_for == change_counter and size < page_count * page_size:
        raise IntegrityError(
            f"ledger {path} is truncated: its header promises {page_count * page_size} bytes, "
            f"the file has {size}; nothing was changed. Restore it from a backup."
        )


def enter_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Switch the file to WAL mode (nothing to do when it is in it already). SQLite
    refuses the switch at once, without its busy handler, while another connection
    holds a lock on a file not yet in WAL mode (another process opening the same new
    file): wait for it as long as any other lock would be waited for, then raise
    SQLite's "database is locked"."""
    deadline = time.monotonic() + busy_timeout
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
