"""The golden ledger of text deltas (SQLite schema 7, files: tests/golden/golden_deltas.py,
deltas7.db): checked, replayed and resumed on every change, its values read back exactly,
so a later crashproof keeps reading what schema 7 wrote."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.journal.records import EventType

HERE = Path(__file__).resolve().parent


@pytest.fixture
def flow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[ModuleType, Path]]:
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("golden_deltas", None)
    import golden_deltas

    golden_deltas.ASKED.clear()
    for found in HERE.glob("deltas7.db*"):
        shutil.copy(found, tmp_path / found.name)
    yield golden_deltas, tmp_path / "deltas7.db"
    sys.modules.pop("golden_deltas", None)


def test_deltas7_as_written(flow: tuple[ModuleType, Path]) -> None:
    _g, path = flow
    with contextlib.closing(sqlite3.connect(path)) as conn:
        version = conn.execute("SELECT value FROM crashproof_meta WHERE key = 'schema_version'")
        assert version.fetchall() == [("7",)]
        kinds = conn.execute("SELECT sum(base IS NULL), sum(base IS NOT NULL) FROM blobs")
        assert kinds.fetchall() == [(2, 9)]  # one whole value per run, the rest deltas


def test_deltas7_checks_replays_and_resumes(flow: tuple[ModuleType, Path]) -> None:
    g, path = flow
    url = f"sqlite:///{path}"
    assert main(["check", "--db", url]) == 0
    verdicts = cp.replay_check([g.register(cp.Ledger("memory://"))], url)
    assert [v.status for v in verdicts] == ["compatible", "compatible"]
    with cp.Ledger(url) as ledger:
        g.register(ledger)
        done = {
            e.key: e.value
            for e in ledger.store.load_events("d-done")
            if e.type is EventType.STEP_DONE
        }
        assert done == {f"turn{t}": g.history("done", t + 1) for t in range(g.TURNS)}
        assert ledger.resume("d-inflight") == g.TURNS
    assert g.ASKED == [7, 8, 9]  # the recorded turns were not asked again
    assert main(["check", "--db", url]) == 0
