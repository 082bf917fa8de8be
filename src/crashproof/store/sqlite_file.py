"""Checks of a SQLite ledger file made before SQLite opens it (and may write to it), and
the switch of a file to WAL mode (the ledger's and its witness')."""

from __future__ import annotations

import sqlite3
import struct
import time
from pathlib import Path

from crashproof.errors import IntegrityError, LedgerError, NotALedger

__all__ = ["check_file", "enter_wal", "wal_pages"]

_HEADER = b"SQLite format 3\x00"


# How long a file shorter than its header says is judged again before it is refused:
# another process creating the ledger, or checkpointing it as it closes, writes its
# pages after its header and removes its WAL after them, so a look between those
# writes (its size, then its header, then its WAL, none under SQLite's locks) sees a
# file that is only not written yet. A truncated file stays so: refused after this.
_SETTLE = 2.0


def check_file(path: Path, settle: float = _SETTLE) -> None:
    """Refuse files that are not SQLite databases, or are shorter than their header says
    for ``settle`` seconds, before SQLite gets a chance to write anything to them."""
    deadline = time.monotonic() + settle
    while True:
        truncated = _judged(path)
        if truncated is None:
            return
        if time.monotonic() >= deadline:
            raise IntegrityError(truncated)
        time.sleep(0.02)


def _judged(path: Path) -> str | None:
    """What is wrong with ``path`` as the ledger's file, as it is now: not a database
    (raised), or shorter than its header says (returned, for ``check_file`` to judge
    again); None when SQLite may open it."""
    if not path.exists():
        if not path.parent.is_dir():
            raise LedgerError(
                f"cannot create ledger {path}: directory {path.parent} does not exist"
            )
        return None
    if not path.is_file():
        raise NotALedger(f"{path} is not a file")
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            header = f.read(100)
    except FileNotFoundError:  # removed meanwhile: a new ledger, as an absent file is
        return None
    if size == 0:
        return None  # an empty file is an empty database; it becomes a new ledger
    if len(header) < 100 or not header.startswith(_HEADER):
        raise NotALedger(
            f"{path} is not a crashproof ledger (not a SQLite database); nothing was changed"
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    change_counter = int.from_bytes(header[24:28], "big")
    page_count = int.from_bytes(header[28:32], "big")
    valid_for = int.from_bytes(header[92:96], "big")
    if valid_for != change_counter or size >= page_count * page_size:
        return None
    # Shorter than its header says. A checkpoint that met a full disk leaves exactly
    # this: page 1 copied back from the WAL, the rest not, and every page still in the
    # WAL, where SQLite reads them (and its next checkpoint writes them back). Judge
    # the file by what SQLite can read: the file's pages plus the WAL's committed ones.
    wal = wal_pages(path.with_name(path.name + "-wal"), page_size)
    pages = wal[1] if wal is not None and wal[1] else page_count
    held = set(range(1, size // page_size + 1)) | (wal[0] if wal is not None else set())
    missing = [n for n in range(1, pages + 1) if n not in held]
    if not missing:
        return None
    in_wal = "" if wal is None else f" or in its WAL ({len(wal[0])} committed pages)"
    return (
        f"ledger {path} is truncated: its header promises {page_count * page_size} bytes, "
        f"the file has {size}, and {len(missing)} of its {pages} pages are neither in "
        f"the file{in_wal}; nothing was changed. Restore it from a backup."
    )


_WAL_MAGIC = (0x377F0682, 0x377F0683)  # little-endian / big-endian checksums


def wal_pages(wal: Path, page_size: int) -> tuple[set[int], int] | None:
    """The pages a SQLite WAL holds up to its last valid commit, and the database's size
    in pages after that commit (0: no commit); None without a WAL for this page size.

    A frame counts only while its salts match the header's and its running checksum
    verifies, as SQLite's own recovery decides (sqlite.org/fileformat2.html#walformat);
    the frames after the last commit frame are a transaction that never committed."""
    try:
        data = wal.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < 32:
        return None
    magic, _, wal_page_size = struct.unpack(">III", data[:12])
    if magic not in _WAL_MAGIC or wal_page_size != page_size:
        return None
    order = ">" if magic & 1 else "<"
    salts = data[16:24]
    s0, s1 = _checksum(order, data[:24], 0, 0)
    if (s0, s1) != struct.unpack(">II", data[24:32]):
        return None
    pages: set[int] = set()
    pending: set[int] = set()
    committed_size = 0
    frame = 24 + page_size
    offset = 32
    while offset + frame <= len(data):
        head = data[offset : offset + 24]
        number, commit = struct.unpack(">II", head[:8])
        if head[8:16] != salts:
            break
        s0, s1 = _checksum(order, head[:8], s0, s1)
        s0, s1 = _checksum(order, data[offset + 24 : offset + frame], s0, s1)
        if (s0, s1) != struct.unpack(">II", head[16:24]):
            break
        pending.add(number)
        if commit:
            pages |= pending
            pending = set()
            committed_size = commit
        offset += frame
    return pages, committed_size


def _checksum(order: str, chunk: bytes, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{order}{len(chunk) // 4}I", chunk)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


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
