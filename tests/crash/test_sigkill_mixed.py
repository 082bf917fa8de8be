"""SIGKILL at every crash point of a workflow with recorded errors, retries and decisions."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parent))
import child_mixed

CHILD = Path(__file__).parent / "child_mixed.py"


def spawn(db: Path, counts: Path, spec: str) -> int:
    return subprocess.run(
        [sys.executable, str(CHILD), str(db), str(counts), spec], check=False
    ).returncode


def resume(db: Path, counts: Path) -> tuple[object, cp.RunInfo]:
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}")
    result = ledger.run(child_mixed.make(counts), run_id="mixed", n=3)
    info = ledger.get_run("mixed")
    ledger.close()
    return result, info


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Counter[str], list[str]]:
    root = tmp_path_factory.mktemp("mixed-ref")
    points = cp.CrashPoints()
    ledger = cp.Ledger(f"sqlite:///{root / 'ref.db'}", crash_points=points)
    result = ledger.run(child_mixed.make(root / "counts"), run_id="mixed", n=3)
    counts = Counter((root / "counts").read_text().split())
    return result, counts, points.passed


def test_reference(reference: tuple[object, Counter[str], list[str]]) -> None:
    result, counts, points = reference
    n_points = len(points)
    assert result == {"total": 3 * 6 + 30, "picks": [0, 1, 0], "flaky": "ok"}
    assert counts["flaky"] == 3
    # started + 3 x (add, boom, ask) + 2 failed attempts + flaky + succeeded, both sides
    assert n_points == 2 * (1 + 9 + 2 + 1 + 1)


@pytest.mark.parametrize("n", range(1, 29))
def test_sigkill_everywhere(
    n: int, tmp_path: Path, reference: tuple[object, Counter[str], list[str]]
) -> None:
    expected, ref_counts, points = reference
    db, counts = tmp_path / "ledger.db", tmp_path / "counts"
    assert spawn(db, counts, f"at:{n}") == -signal.SIGKILL
    result, info = resume(db, counts)
    assert result == expected
    assert info.status is cp.RunStatus.SUCCEEDED
    assert info.budget.decisions == 3
    assert info.budget.tokens == 30
    got = Counter(counts.read_text().split())
    # At most the one body whose commit the crash lost runs again.
    extra = {k: got[k] - ref_counts[k] for k in got if got[k] != ref_counts[k]}
    assert sum(extra.values()) <= 1, extra
    assert all(v == 1 for v in extra.values()), extra
    flaky = next(s for s in info.steps if s.key == "flaky")
    # Journaled attempts count across the crash; a failed attempt whose record the crash
    # lost is indistinguishable from one that never ran (it changed nothing outside).
    lost_attempt = points[n - 1] == "before_commit[attempt_failed:flaky]"
    assert flaky.attempts == (2 if lost_attempt else 3)
