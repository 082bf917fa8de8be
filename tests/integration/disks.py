"""A real small disk for the tests of the machine failing under a tool: a tmpfs mounted
for one test, filled up as a disk fills (ENOSPC). Mounting needs root (CAP_SYS_ADMIN):
where it is refused the test is skipped, never faked; the mount is always undone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk_at(mount: Path, size: str = "8m") -> Iterator[Path]:
    """A real ``size`` filesystem (tmpfs) mounted at ``mount`` (made) for the block."""
    mount.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path, leave: int) -> Path:
    """A file taking all but ``leave`` bytes of the disk's free space."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler
