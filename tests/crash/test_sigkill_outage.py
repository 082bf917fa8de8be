"""SIGKILL of a real child at every crash point of a run that meets a model outage (it
stops, resumable), is resumed, fails, and is retried under its own id, in ``output``
and ``full`` durability on SQLite. Recovered by a new process's operator loop, each
point must end as the uninterrupted lifecycle did: one pull request, no recorded
decision asked again, the same result."""

from __future__ import annotations

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
from crashproof.journal.records import EventType

sys.path.insert(0, str(Path(__file__).parent))
import child_outage

CHILD = Path(__file__).parent / "child_outage.py"


def _reference() -> tuple[Any, list[str], list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "down").touch()
        (root / "broken").touch()
        points = cp.CrashPoints()
        with cp.Ledger("memory://", crash_points=points) as ledger:
            result = child_outage.drive(ledger, root, fix=False)
            kinds = [e.type.value for e in ledger.journal(child_outage.RUN)]
        return result, points.passed, kinds


REFERENCE, POINTS, KINDS = _reference()


def _counts(directory: Path) -> Counter[str]:
    path = directory / "counts"
    return Counter(path.read_text().split()) if path.exists() else Counter()


def test_the_reference_stops_fails_and_is_retried() -> None:
    assert KINDS.count("run_stopped") == 1
    assert KINDS.count("run_retried") == 1
    for side in ("before_commit", "after_commit"):
        assert f"{side}[run_stopped:turn]" in POINTS
        assert f"{side}[run_retried]" in POINTS
    assert REFERENCE == {"plan": "plan for x", "pr": {"number": 1}, "checked": 10}


@pytest.mark.parametrize("durability", ["output", "full"])
@pytest.mark.parametrize("n", range(1, len(POINTS) + 1), ids=POINTS)
def test_sqlite(n: int, durability: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    code = subprocess.run(
        [sys.executable, str(CHILD), url, durability, str(tmp_path), f"at:{n}"], check=False
    ).returncode
    point = POINTS[n - 1]
    assert code == -signal.SIGKILL, point
    asked_before = _counts(tmp_path)["ask"]
    with cp.Ledger(url) as ledger:
        started = ledger.store.get_run(child_outage.RUN) is not None
        journal = ledger.journal(child_outage.RUN) if started else []
        turn_recorded = any(e.type is EventType.STEP_DONE and e.key == "turn" for e in journal)
        got = child_outage.drive(ledger, tmp_path, fix=True)
        info = ledger.get_run(child_outage.RUN)
    assert got == REFERENCE, point
    assert info.status is cp.RunStatus.SUCCEEDED, point
    target = json.loads((tmp_path / "target.json").read_text())
    assert list(target) == ["o/open-pr"], point  # one pull request, under its operation id
    assert target["o/open-pr"]["n"] == 1, point  # asked once: the retry replayed its receipt
    asked = _counts(tmp_path)["ask"]
    if turn_recorded:  # a recorded decision is never asked again
        assert asked == asked_before, point
