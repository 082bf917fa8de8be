"""A ledger whose requests were stored inline, in each decision's record (SQLite schema 8,
``store_requests=True``, before requests were kept beside their records): it opens
(migrated to schema 9), its requests are still shown, and a resume stores the next one
beside its record as a delta of the inline ones, shown too (files:
tests/golden/golden_requests.py, requests8.db)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.runtime.operations.contents import step_contents

HERE = Path(__file__).resolve().parent


@pytest.fixture
def flow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[ModuleType, str]]:
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("golden_requests", None)
    import golden_requests

    for found in HERE.glob("requests8.db*"):
        shutil.copy(found, tmp_path / found.name)
    yield golden_requests, f"sqlite:///{tmp_path / 'requests8.db'}"
    sys.modules.pop("golden_requests", None)


def texts(ledger: cp.Ledger, run_id: str, key: str) -> list[str | None]:
    found = step_contents(ledger.journal(run_id), [key], lambda: ledger.store.load_requests(run_id))
    prompt = found[key].prompt
    assert prompt is not None
    assert prompt.refused is None, prompt.refused
    return [m["text"] for m in prompt.messages]


def test_inline_requests_show_and_a_resume_stores_the_next_beside(
    flow: tuple[ModuleType, str],
) -> None:
    g, url = flow
    assert main(["check", "--db", url]) == 0
    with cp.Ledger(url) as ledger:
        assert ledger.store.schema_version() == 9
        assert ledger.store.load_requests("q-done") == {}  # all inline
        assert texts(ledger, "q-done", "turn")[-1] == "ask 0"
        assert texts(ledger, "q-done", "turn#3")[-3:] == ["ask 1", "reply 4 — café", "ask 2"]
        g.register(ledger)
        assert ledger.resume("q-inflight") == 1 + 2 * g.TURNS
        assert g.ASKED == [6]  # only the last turn: the recorded ones were not asked
        done = ledger.journal("q-inflight")[-2]
        assert done.key == "turn#3"
        assert "request_sha256" in done.payload
        assert "request" not in done.payload
        kept = ledger.store.load_requests("q-inflight")
        assert list(kept) == [done.seq]
        assert '"base":4' in kept[done.seq]  # only what it adds to the inline turn#2's 4
        assert texts(ledger, "q-inflight", "turn#3") == texts(ledger, "q-done", "turn#3")
