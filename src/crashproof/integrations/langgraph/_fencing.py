"""Who may write a LangGraph thread: the per-thread lease and its fencing token, read
and checked in the write's own transaction (CrashproofSaver._writing), and its renewal
while a graph runs (CrashproofSaver.hold).

Why renewal is asked for, not automatic: a checkpointer sees puts and reads, never a
run's start or end. A node that runs for minutes is silence between two puts, exactly
like a thread whose last invoke returned; renewing every thread a saver ever wrote
would keep other processes out of idle threads for as long as this one lives.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import crashproof as cp
import crashproof.integrations.langgraph._db as _db
from crashproof.integrations.langgraph._rows import Head, SealedRows

__all__ = ["HOST", "Renewal", "dead", "held_head", "renew_lease"]

HOST = socket.gethostname()
log = logging.getLogger(__name__)


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


def renew_lease(db: _db.Database, thread_id: str, owner: str, token: int, seconds: float) -> bool:
    """Extend ``owner``'s lease on the thread by ``seconds`` from now; False when the
    thread is no longer held with ``token`` (taken over, released or deleted). The
    expiry is not sealed (the head's seal covers its generation and checkpoints), so a
    renewal is one unsealed update, no new generation."""
    with db.write() as q:
        renewed = q(
            "UPDATE langgraph_threads SET lease_expires = ? WHERE thread_id = ? "
            "AND owner = ? AND token = ? RETURNING token",
            (db.now(q) + seconds, thread_id, owner, token),
        )
    return bool(renewed)


class Renewal:
    """A daemon thread that calls ``renew()`` every ``every`` seconds until stopped or
    until ``renew`` answers False (the lease is lost: the next write says so)."""

    def __init__(self, renew: Callable[[], bool], every: float, thread_id: str) -> None:
        self._renew = renew
        self._every = every
        self._thread_id = thread_id
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"crashproof-lease-{thread_id}", daemon=True
        )

    def __enter__(self) -> Renewal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                if not self._renew():
                    log.warning(
                        "the lease on LangGraph thread %r was taken over; not renewed",
                        self._thread_id,
                        extra={"thread_id": self._thread_id},
                    )
                    return
            except Exception as exc:  # a database hiccup: the next round tries again
                log.warning(
                    "renewing the lease on LangGraph thread %r failed: %s",
                    self._thread_id,
                    exc,
                    extra={"thread_id": self._thread_id},
                )
