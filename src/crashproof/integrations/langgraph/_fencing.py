"""Who may write a LangGraph thread: the per-thread lease and its fencing token, read
and checked in the write's own transaction (CrashproofSaver._writing)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import crashproof as cp
import crashproof.integrations.langgraph._db as _db
from crashproof.integrations.langgraph._rows import Head, SealedRows

__all__ = ["HOST", "dead", "held_head"]

HOST = socket.gethostname()


def dead(owner: str) -> bool:
    """The holder is a process of this host that no longer exists (or a zombie)."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != HOST or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def held_head(
    q: _db.Query,
    thread_id: str,
    sealed_rows: SealedRows,
    tokens: dict[str, int],
    owner: str,
    now: Callable[[_db.Query], float],
) -> Head | None:
    """The thread's verified head, locked for this write, once this saver may write it:
    None for a thread not written yet; StaleLeaseError when another saver took it over
    (or it vanished under this one), LeaseHeld while a live holder's lease runs."""
    head = sealed_rows.head(q, thread_id, lock=True)  # (PostgreSQL's placeholder: None)
    if head is None:
        if thread_id in tokens:
            raise cp.StaleLeaseError(
                f"thread {thread_id!r} is gone from the database although this saver "
                "wrote to it; nothing of this write was kept"
            )
        return None
    mine = tokens.get(thread_id)
    if mine is not None and head.token != mine:
        tokens.pop(thread_id, None)
        raise cp.StaleLeaseError(
            f"thread {thread_id!r} was taken over by {head.owner} (fencing token {mine} "
            f"is superseded by {head.token}); nothing of this write was kept"
        )
    if (
        head.owner is not None
        and head.owner != owner
        and head.expires is not None
        and head.expires > now(q)
        and not dead(head.owner)
    ):
        raise cp.LeaseHeld(
            f"thread {thread_id!r} is being written by {head.owner} (its lease runs "
            f"{head.expires - now(q):.1f} s more); nothing was written. Wait "
            "for it to finish (its lease expires), or drive the thread from one "
            "process at a time.",
            owner=head.owner,
            expires_at=head.expires,
        )
    return head
