"""The seed's failure, reproduced and fixed: 8 steps s0..s7 append +line-0..+line-7 to
one file through the workspace; a real child process is killed by SIGKILL at every
crash window of every act — including between the file write and the receipt at step 6
— and the resumed run ends with each line exactly once and the same fingerprint."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parent))
import workspace_child

CHILD = Path(__file__).parent / "workspace_child.py"
LINES = "".join(f"+line-{k}\n" for k in range(8))


def _points() -> list[str]:
    points = []
    for k in range(8):
        points += [
            f"before_commit[act_intent:s{k}]",
            f"after_commit[act_intent:s{k}]",
            f"inside[act:s{k}:written]",
            f"inside[act:s{k}:renamed]",
            f"before_commit[step_done:s{k}]",
            f"after_commit[step_done:s{k}]",
        ]
    return points


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    root = tmp_path_factory.mktemp("seed-ref")
    (root / "ws").mkdir()
    points = cp.CrashPoints()
    ledger = cp.Ledger(f"sqlite:///{root / 'ref.db'}", crash_points=points)
    fingerprint = ledger.run(workspace_child.make(cp.Workspace(root / "ws")), run_id="seed")
    return fingerprint, points.passed


def test_reference_passes_every_window(reference: tuple[str, list[str]]) -> None:
    fingerprint, passed = reference
    assert len(fingerprint) == 64
    for point in _points():
        assert point in passed


@pytest.mark.parametrize("point", _points())
def test_sigkill_in_every_act_window(
    point: str, tmp_path: Path, reference: tuple[str, list[str]]
) -> None:
    fingerprint, _ = reference
    ws = tmp_path / "ws"
    ws.mkdir()
    db = tmp_path / "l.db"
    child = subprocess.run([sys.executable, str(CHILD), str(db), str(ws), point], check=False)
    assert child.returncode == -signal.SIGKILL
    ledger = cp.Ledger(f"sqlite:///{db}")
    assert ledger.run(workspace_child.make(cp.Workspace(ws)), run_id="seed") == fingerprint
    assert (ws / "notes.txt").read_text() == LINES  # each line exactly once
    assert sorted(p.name for p in ws.iterdir()) == ["notes.txt"]  # no temp file left
    info = ledger.get_run("seed")
    assert [s.operation_id for s in info.steps] == [f"seed/s{k}" for k in range(8)]
    assert all(s.status is cp.StepStatus.SUCCEEDED for s in info.steps)
