"""Power cuts on a real filesystem (issue #38): ext4 on a loop device, a child process
driving concurrent runs in ``output`` durability on it, the device's image copied at
the instant the child dies, then the copy mounted and every run resumed: 0 runs
refused, 0 effects duplicated, 0 runs lost.

What a trial simulates. The child is SIGKILLed and reaped (none of its code runs after
that instant, so nothing more leaves it), then the loop device's backing file is copied:
what the block device received so far, i.e. every write an fsync forced and whatever the
kernel wrote back unforced, without anything still in the page cache. The filesystem is
mounted with ``commit=600`` so its journal commits when an fsync asks rather than every
5 s, and the child lives for seconds, below the kernel's 30 s dirty-page expiry: the
copy holds little beyond what fsyncs made durable. The device's write counters are read
around the copy, which is taken again if any I/O completed meanwhile, so the copy is
the state of one instant, not a mix. Mounting the copy replays ext4's journal, as a
reboot does. Limits: a completed write is kept whole and in order (a disk whose
volatile cache loses unflushed writes in any order, or tears a sector, is not
simulated: that needs dm-log-writes, absent here); the verifier's power-cut mode keeps
no unsynced write at all, the harshest case (tests/verify/test_verify_powercut.py).

Skipped where loop devices cannot be set up (not root, no losetup or mkfs.ext4).
``POWERCUT_TRIALS`` sets the count (3 here; ``make chaos`` runs 24).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import crashproof as cp
from crash.child_powercut import EXPECTED, make

CHILD = Path(__file__).with_name("child_powercut.py")
TRIALS = int(os.environ.get("POWERCUT_TRIALS", "3"))
SEED = int(os.environ.get("POWERCUT_SEED", "38"))
RUNS = 32  # concurrent runs per wave in the child (its journal key: tests/conftest.py)
IMAGE_MIB = 32


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root for losetup and mount"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class Mounted:
    """An ext4 image attached to a loop device and mounted."""

    def __init__(self, image: Path, mountpoint: Path) -> None:
        self.image, self.mountpoint = image, mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.device = _run("losetup", "--find", "--show", str(image))
        try:
            _run("mount", "-t", "ext4", "-o", "commit=600", self.device, str(mountpoint))
        except BaseException:
            _run("losetup", "-d", self.device)
            raise

    def writes(self) -> tuple[int, int]:
        """The device's completed writes and its I/O in flight (/sys/block/*/stat)."""
        fields = Path(f"/sys/block/{Path(self.device).name}/stat").read_text().split()
        return int(fields[4]), int(fields[8])

    def copy_to(self, target: Path) -> None:
        """The backing file as the device holds it at one instant: copied again while
        any write completed during the copy."""
        for _ in range(20):
            before = self.writes()
            shutil.copyfile(self.image, target)
            if self.writes() == before and before[1] == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.device} kept writing during 20 copies of its image")

    def close(self) -> None:
        for _ in range(50):
            if (
                subprocess.run(["umount", str(self.mountpoint)], capture_output=True).returncode
                == 0
            ):
                break
            time.sleep(0.1)
        subprocess.run(["losetup", "-d", self.device], capture_output=True)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    probe = tmp_path / "probe.img"
    with probe.open("wb") as f:
        f.truncate(8 << 20)
    try:
        _run("mkfs.ext4", "-q", "-F", str(probe))
        Mounted(probe, tmp_path / "probe").close()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot mount an ext4 image on a loop device here: {exc}")
    return tmp_path


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _trial(scratch: Path, number: int, rng: random.Random) -> dict[str, int]:
    trial = scratch / f"t{number}"
    outside = trial / "outside"
    outside.mkdir(parents=True)
    image = trial / "disk.img"
    with image.open("wb") as f:
        f.truncate(IMAGE_MIB << 20)
    _run("mkfs.ext4", "-q", "-F", str(image))
    disk = Mounted(image, trial / "mnt")
    try:
        child = subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                str(disk.mountpoint / "ledger.db"),
                str(outside),
                str(RUNS),
            ],
            stderr=subprocess.PIPE,
        )
        # Cut once the runs are under way: some effects done, some runs finished or not.
        deadline = time.monotonic() + 60
        wanted = rng.randint(1, 4 * RUNS)
        while len(_lines(outside / "effects")) < wanted and time.monotonic() < deadline:
            if child.poll() is not None:
                raise RuntimeError(f"the child died: {child.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)  # the power goes: nothing more leaves the child
        child.wait()
        disk.copy_to(trial / "cut.img")
    finally:
        disk.close()
    cut = Mounted(trial / "cut.img", trial / "after")  # the reboot: ext4 replays its journal
    try:
        return _recover(cut.mountpoint / "ledger.db", outside)
    finally:
        cut.close()
        image.unlink()
        (trial / "cut.img").unlink()


def _recover(database: Path, outside: Path) -> dict[str, int]:
    """Resume every run the child asked for (start it again where the cut lost it), as
    its caller would after the reboot; judge what happened outside."""
    import asyncio

    asked = {run_id: int(n) for run_id, n in _lines(outside / "asked")}
    done_before = {run_id: int(result) for run_id, result in _lines(outside / "done")}
    effects_before = len(_lines(outside / "effects"))
    flow = make(outside)
    refused: list[str] = []
    results: dict[str, object] = {}

    async def resume_all(ledger: cp.Ledger) -> None:
        async def one(run_id: str, n: int) -> None:
            try:
                results[run_id] = await ledger.run_async(flow, run_id=run_id, n=n)
            except cp.CrashproofError as exc:
                refused.append(f"{run_id}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(run_id, n) for run_id, n in asked.items()))

    with cp.Ledger(f"sqlite:///{database}") as ledger:
        known = {row.run_id for row in ledger.runs()}
        checked = ledger.check()
        asyncio.run(resume_all(ledger))
    assert refused == [], f"{len(refused)} runs refused after the cut: {refused[:3]}"
    assert [c for c in checked if c[1] is not None] == [], checked
    for run_id, n in asked.items():
        assert results[run_id] == EXPECTED[n], (run_id, results[run_id])
    for run_id, result in done_before.items():  # handed back before the cut: kept
        assert run_id in known, f"{run_id} finished before the cut and is lost"
        assert results[run_id] == result
    executed = Counter(op for _, _, op, _ in _lines(outside / "effects"))
    duplicated = {op: k for op, k in executed.items() if k > 1}
    assert duplicated == {}, f"effects done twice: {duplicated}"
    per_run = Counter(run_id for run_id, _, _, _ in _lines(outside / "effects"))
    assert all(per_run[run_id] == 3 for run_id in asked), "a run without its three effects"
    return {
        "runs": len(asked),
        "finished before": len(done_before),
        "in journal": len(known),
        "effects before": effects_before,
        "effects after": sum(executed.values()) - effects_before,
    }


def test_power_cuts_of_an_ext4_image_lose_refuse_and_duplicate_nothing(scratch: Path) -> None:
    rng = random.Random(SEED)
    totals: Counter[str] = Counter()
    for number in range(TRIALS):
        totals.update(_trial(scratch, number, rng))
    print(f"\n{TRIALS} power cuts: {dict(totals)}")
