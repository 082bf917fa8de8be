"""The golden agent loop recorded with arguments digest format 1 (a whole message list
per turn, before #22) replays and resumes under format 2; a changed earlier message is
still a non-determinism (files: tests/golden/golden_transcript.py, transcript1.db)."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from types import ModuleType

import pytest

import crashproof as cp
from crashproof.cli import main

HERE = Path(__file__).resolve().parent


@pytest.fixture
def flow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[ModuleType, str]]:
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("golden_transcript", None)
    import golden_transcript

    for found in HERE.glob("transcript1.db*"):
        shutil.copy(found, tmp_path / found.name)
    yield golden_transcript, f"sqlite:///{tmp_path / 'transcript1.db'}"
    sys.modules.pop("golden_transcript", None)


def digests(url: str, run_id: str) -> list[str]:
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
        rows = conn.execute(
            "SELECT json_extract(payload, '$.digest') FROM events "
            "WHERE run_id = ? AND type = 'step_done' ORDER BY seq",
            (run_id,),
        )
        return [d for (d,) in rows]


def test_format_1_turns_replay_and_the_resume_records_format_2(
    flow: tuple[ModuleType, str],
) -> None:
    g, url = flow
    assert all(not d.startswith("a2:") for d in digests(url, "t-inflight"))
    assert main(["check", "--db", url]) == 0
    assert [v.status for v in cp.replay_check([g.register(cp.Ledger("memory://"))], url)] == [
        "compatible",
        "compatible",
    ]
    with cp.Ledger(url) as ledger:
        g.register(ledger)
        assert ledger.resume("t-inflight") == 1 + 2 * g.TURNS
    assert g.ASKED == [8]  # only the last turn: the three recorded ones were not asked
    recorded = digests(url, "t-inflight")
    assert [d.startswith("a2:") for d in recorded] == [False, False, False, True]
    assert main(["check", "--db", url]) == 0


def test_a_changed_first_message_is_a_mismatch_on_format_1_turns(
    flow: tuple[ModuleType, str],
) -> None:
    g, url = flow
    g.EDIT["on"] = True
    verdicts = cp.replay_check([g.register(cp.Ledger("memory://"))], url)
    assert [(v.status, v.step) for v in verdicts] == [("non_deterministic", 1)] * 2
    with cp.Ledger(url) as ledger:
        g.register(ledger)
        # Written at schema 6: the drive's compatibility verdict (the schema changed
        # since) replays it first and names the same mismatch.
        with pytest.raises(
            cp.RunFrozen, match=r"arguments differ|non-deterministic at step 1 \(recorded decide"
        ):
            ledger.resume("t-inflight")
    assert g.ASKED == []
