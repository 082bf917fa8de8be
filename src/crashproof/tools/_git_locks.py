"""Git's lock files left by our own dead git commands: recognised and cleared.

Git takes a lock by creating ``<file>.lock`` (the index, a ref, ``packed-refs``) and
releases it by renaming or deleting it. A git process killed in between (the process group
SIGKILLed during ``git add`` or ``git update-ref``) leaves the lock behind, and every later
git command refuses to run: "Unable to create '….lock': File exists". Git writes no owner
into a lock, so by itself a lock cannot say whether its holder is alive.

``GitTool`` therefore runs every git command that may take a lock as the *owner* of the
repository: it holds an exclusive ``flock`` on ``<git common dir>/crashproof-git.owner``,
passes that descriptor to git (so git and anything git starts hold it too), and writes into
the file who runs what (host, boot, pid, start time, timeout). A command that ends,
however it ends, empties the file. So the next owner that finds the file non-empty knows
that a git command of ours was running and that its whole process tree is dead (the
kernel released the ``flock`` only when the last of them exited). Then, on the same host
(and boot), every ``*.lock`` of the repository's git directories made while that command
could have run (modification time within its start time and timeout) was left by it,
and is removed: git's own advice ("remove the file if no git process is running") with the
proof it asks for. A lock from another host, from before our command started, or from a
git process that is not ours stays where it is: the act meets ``cp.ResourceBusy`` and, after
the runtime's retries, is frozen for a later resume (never recorded as failed).

What remains: a git process of someone else that takes the same lock file in the
repository while our dead command's window is open (at most ``timeout`` seconds after it
started) would lose its lock; git's own advice has the same hole.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crashproof.errors import ResourceBusy

__all__ = ["OWNER_FILE", "git_owner"]

logger = logging.getLogger(__name__)

OWNER_FILE = "crashproof-git.owner"
_SLACK = 2.0  # seconds: coarse file-system timestamps and clock steps
_POLL = 0.05


@contextmanager
def git_owner(
    common_dir: Path, git_dirs: Sequence[Path], timeout: float, what: str
) -> Iterator[int]:
    """Be the repository's owner for one git command; yields the descriptor to pass to git.

    Waits up to ``timeout`` seconds for another live owner (another thread or process of
    ours), then raises ``ResourceBusy``."""
    path = common_dir / OWNER_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _acquire(fd, path, timeout)
        try:
            previous = _read(fd)
            if previous is not None:
                _clear_stale(previous, git_dirs)
            _write(fd, _record(what, timeout))
            yield fd
        finally:
            os.ftruncate(fd, 0)  # ended, however: nothing of ours runs any more
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            raise ResourceBusy(
                f"another process of ours has run git in {path.parent} for more than "
                f"{timeout:g} s (it holds {path}); nothing was done"
            )
        time.sleep(_POLL)


def _record(what: str, timeout: float) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": os.getpid(),
        "started": time.time(),
        "timeout": timeout,
        "command": what,
    }


def _read(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:  # torn by a crash while it was written: nothing to go by
        return {}
    return record if isinstance(record, dict) else {}


def _write(fd: int, record: dict[str, Any]) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(record, sort_keys=True).encode())


def _clear_stale(dead: dict[str, Any], git_dirs: Sequence[Path]) -> None:
    """Remove the locks ``dead`` (a command whose process tree has exited) left behind."""
    host, boot = socket.gethostname(), _boot_id()
    started, timeout = dead.get("started"), dead.get("timeout")
    if dead.get("host") != host or not isinstance(started, float | int):
        return  # another host's processes are not ours to judge, nor a torn record
    if not isinstance(timeout, float | int):
        return
    if boot is not None and dead.get("boot") not in (boot, None):
        # Rebooted since: everything that ran then is dead, whatever its timeout.
        timeout = float("inf")
    low, high = started - _SLACK, started + timeout + _SLACK
    for lock in _locks(git_dirs):
        try:
            made = lock.lstat().st_mtime
        except FileNotFoundError:
            continue
        if low <= made <= high:
            lock.unlink(missing_ok=True)
            logger.warning(
                "removed %s, left by a git command of ours that died (pid %s, %s)",
                lock,
                dead.get("pid"),
                dead.get("command"),
                extra={"lock": str(lock), "dead_pid": dead.get("pid")},
            )


def _locks(git_dirs: Sequence[Path]) -> Iterator[Path]:
    """The lock files git may leave: beside the index, HEAD, config and packed-refs at the
    top of each git directory, and beside every ref under ``refs/``."""
    seen: set[Path] = set()
    for git_dir in git_dirs:
        if git_dir in seen:
            continue
        seen.add(git_dir)
        yield from git_dir.glob("*.lock")
        refs = git_dir / "refs"
        if refs.is_dir():
            yield from refs.rglob("*.lock")


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None
