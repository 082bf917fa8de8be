"""SIGKILL of a real child at every crash point of an async workflow, in ``output`` and
``full`` durability, on SQLite and PostgreSQL; resumed by a new process's async drive.
Each point must end as the uninterrupted run did: one effect per act, no decision that
was recorded asked again."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parent))
import child_async

CHILD = Path(__file__).parent / "child_async.py"


def _reference() -> tuple[Any, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        points = cp.CrashPoints()
        with cp.Ledger("memory://", crash_points=points) as ledger:
            result = asyncio.run(ledger.run_async(child_async.make(root), run_id="a", files=2))
        return result, points.passed


REFERENCE, POINTS = _reference()


def _counts(directory: Path) -> Counter[str]:
    path = directory / "counts"
    return Counter(path.read_text().split()) if path.exists() else Counter()


def _check(url: str, directory: Path, point: str) -> None:
    before = _counts(directory)
    with cp.Ledger(url) as ledger:
        got = asyncio.run(ledger.run_async(child_async.make(directory), run_id="a", files=2))
        info = ledger.get_run("a")
    assert got == REFERENCE, point
    assert info.status is cp.RunStatus.SUCCEEDED
    assert info.budget.decisions == 2
    for name in ("f0.txt", "f1.txt"):
        assert (directory / "ws" / name).read_text() == name
    target = json.loads((directory / "target.json").read_text())
    assert list(target) == ["a/post"]  # one effect, under the act's operation id
    calls = _counts(directory)
    # A body runs again only when the crash lost its record; a decision whose record
    # committed before the crash is never asked again.
    assert sum(calls.values()) - len(calls) <= 1, (point, calls)
    for decision in ("plan", "review"):
        if before[decision] and f"before_commit[step_done:{decision}]" != point:
            assert calls[decision] == 1, (point, decision)


def _kill_and_resume(url: str, durability: str, directory: Path, n: int) -> None:
    code = subprocess.run(
        [sys.executable, str(CHILD), url, durability, str(directory), f"at:{n}"], check=False
    ).returncode
    assert code == -signal.SIGKILL, POINTS[n - 1]
    _check(url, directory, POINTS[n - 1])


def test_the_reference_passes_every_kind_of_point() -> None:
    assert "inside[act:post:written]" in POINTS
    assert "inside[act:write:f0.txt:renamed]" in POINTS
    assert "before_commit[step_done:plan]" in POINTS
    assert REFERENCE["verdict"] == "ok 12"


@pytest.mark.parametrize("durability", ["output", "full"])
@pytest.mark.parametrize("n", range(1, len(POINTS) + 1), ids=POINTS)
def test_sqlite(n: int, durability: str, tmp_path: Path) -> None:
    _kill_and_resume(f"sqlite:///{tmp_path / 'l.db'}", durability, tmp_path, n)


@pytest.mark.parametrize("durability", ["output", "full"])
@pytest.mark.parametrize("n", range(1, len(POINTS) + 1), ids=POINTS)
def test_postgres(n: int, durability: str, pg_url: str, tmp_path: Path) -> None:
    _kill_and_resume(pg_url, durability, tmp_path, n)
