"""Checks of a SQLite ledger file made before SQLite opens it (and may write to it)."""

from __future__ import annotations

from pathlib import Path

from crashproof.errors import IntegrityError, LedgerError, NotALedger

__all__ = ["check_file"]

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
