"""A real small disk for the tests of the machine failing under a tool: a tmpfs mounted
for one test, filled up as a disk fills (ENOSPC), and an ext4 disk on a loop device
whose backing file lives on such a tmpfs, so that a block of it can fail to be written
(EIO). Mounting needs root (CAP_SYS_ADMIN): where it is refused the test is skipped,
never faked; the mounts are always undone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from shutil import which

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


@contextmanager
def ext4_on_loop_at(mount: Path, backing: Path) -> Iterator[Path]:
    """A real ext4 file system (4 KiB blocks, no journal) mounted at ``mount``, on a loop
    device whose sparse 64 MiB image lives on a 16 MiB tmpfs mounted at ``backing``. A
    block whose image page is a hole cannot be written once that tmpfs is full: the loop
    device fails the write and the kernel reports EIO (``fail_block_writes``)."""
    missing = [t for t in ("mkfs.ext4", "losetup", "filefrag", "fallocate") if not which(t)]
    if missing:
        pytest.skip(f"no {', '.join(missing)} here")
    with small_disk_at(backing, "16m"):
        image = backing / "ext4.img"
        image.write_bytes(b"")
        os.truncate(image, 64 << 20)
        subprocess.run(
            [
                "mkfs.ext4",
                "-q",
                "-b",
                "4096",
                "-O",
                "^has_journal",
                "-E",
                "lazy_itable_init=0",
                str(image),
            ],
            check=True,
            capture_output=True,
        )
        made = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot set up a loop device here: {made.stderr.decode().strip()}")
        device = made.stdout.decode().strip()
        try:
            mount.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", device, str(mount)], check=True)
            try:
                yield mount
            finally:
                subprocess.run(["umount", str(mount)], check=True)
        finally:
            subprocess.run(["losetup", "-d", device], check=True)


def fail_block_writes(directory: Path, backing: Path) -> Path:
    """From now on, writing ``directory``'s block (of an ``ext4_on_loop_at`` disk) fails
    with EIO: its page of the image is punched out and the tmpfs under the image filled
    (the filler returned). The block stays in the kernel's cache: reads still succeed."""
    extents = subprocess.run(
        ["filefrag", "-v", str(directory)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    block = int(extents[3].split(":")[2].split("..")[0])  # one extent: the first row
    subprocess.run(
        [
            "fallocate",
            "--punch-hole",
            "--offset",
            str(block * 4096),
            "--length",
            "4096",
            str(backing / "ext4.img"),
        ],
        check=True,
    )
    return fill(backing, 0)
