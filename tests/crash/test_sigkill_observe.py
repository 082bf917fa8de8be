"""Environment observation after a real SIGKILL: a child process running the seed's
8-act workspace task is killed mid-way; an unchanged workspace resumes to the reference
fingerprint, and a workspace someone edited while the run was down pauses in
needs_review — both observations as evidence — without executing anything."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import crashproof as cp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
import workspace_child  # noqa: E402

CHILD = HERE.parent / "integration" / "workspace_child.py"
POINTS = [
    "after_commit[step_done:s2]",  # between two acts
    "after_commit[act_intent:s3]",  # an act in flight, not executed
    "inside[act:s3:renamed]",  # an act done, its receipt lost
]


def _killed(tmp_path: Path, point: str) -> tuple[Path, Path]:
    ws, db = tmp_path / "ws", tmp_path / "l.db"
    ws.mkdir()
    child = subprocess.run([sys.executable, str(CHILD), str(db), str(ws), point], check=False)
    assert child.returncode == -signal.SIGKILL
    return ws, db


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("observe-ref")
    (root / "ws").mkdir()
    ledger = cp.Ledger(f"sqlite:///{root / 'ref.db'}")
    result: str = ledger.run(workspace_child.make(cp.Workspace(root / "ws")), run_id="seed")
    return result


@pytest.mark.parametrize("point", POINTS)
def test_unchanged_workspace_resumes_to_the_reference(
    point: str, tmp_path: Path, reference: str
) -> None:
    ws, db = _killed(tmp_path, point)
    ledger = cp.Ledger(f"sqlite:///{db}")
    assert ledger.run(workspace_child.make(cp.Workspace(ws)), run_id="seed") == reference


@pytest.mark.parametrize("point", POINTS)
def test_edited_workspace_pauses_without_executing(point: str, tmp_path: Path) -> None:
    ws, db = _killed(tmp_path, point)
    notes = (ws / "notes.txt").read_text()
    (ws / "other.txt").write_text("someone else was here\n")
    observed = cp.Workspace(ws).observe()
    ledger = cp.Ledger(f"sqlite:///{db}")
    with pytest.raises(cp.RunFrozen) as frozen:
        ledger.run(workspace_child.make(cp.Workspace(ws)), run_id="seed")
    assert isinstance(frozen.value.cause, cp.EnvironmentChanged)
    assert (ws / "notes.txt").read_text() == notes  # nothing executed
    info = ledger.get_run("seed")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    (change,) = info.evidence["environments"]  # type: ignore[index]
    assert change["observed"] == observed.to_json()
    assert change["recorded"]["instance"] == observed.instance
    assert change["recorded"]["fingerprint"] != observed.fingerprint
