"""``Ledger.check`` verifies the model requests kept beside a run's records, on every
store: a text altered, a text removed where its record names one, or a text no record
names is a finding of its run (records verified first); a clean ledger, and one written
with ``store_requests=False``, pass. The texts are read after the records: texts whose
records came later (a run driven meanwhile) are never strays."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.operations.request_check import check_requests

# What each edit does to the text kept for a record, per store (behind the ledger's back).
_SQLITE = {  # a text is kept under its record's row id (run_no * 2^32 + seq), in parts
    "alter": "UPDATE requests SET text = replace(text, 'question', 'QUESTION') WHERE record = "
    "(SELECT run_no << 32 FROM runs WHERE run_id = ?1) + ?2",
    "delete": "DELETE FROM requests WHERE record = (SELECT run_no << 32 FROM runs "
    "WHERE run_id = ?1) + ?2",
    "add": "INSERT INTO requests (record, text) SELECT (run_no << 32) + ?2, '{}' FROM runs "
    "WHERE run_id = ?1",
}
_POSTGRES = {
    "alter": "UPDATE requests SET text = replace(text, 'question', 'QUESTION') "
    "WHERE run_id = %s AND seq = %s",
    "delete": "DELETE FROM requests WHERE run_id = %s AND seq = %s",
    "add": "INSERT INTO requests (run_id, seq, text) VALUES (%s, %s, '{}')",
}


def _agent(ledger: cp.Ledger) -> None:
    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        history: list[Any] = [{"role": "system", "content": "be brief"}]
        ctx.step("setup", lambda: "ready")
        for n in range(3):
            history.append({"role": "user", "content": f"question {n}"})
            history.append(
                ctx.decide("turn", lambda messages: {"n": len(messages)}, messages=history)
            )
        return len(history)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'l.db'}"
    return str(request.getfixturevalue("pg_url"))


def _ledger(url: str, **kwargs: Any) -> cp.Ledger:
    ledger = cp.Ledger(url, **kwargs)
    _agent(ledger)
    for run_id in ("a", "b", "c"):
        ledger.run("agent", run_id=run_id)
    return ledger


@pytest.fixture
def ledger(url: str) -> Iterator[cp.Ledger]:
    ledger = _ledger(url)
    yield ledger
    ledger.close()


def _seqs(ledger: cp.Ledger, run_id: str) -> tuple[list[int], int]:
    """The run's decisions' record seqs, and its step ``setup``'s (which names none)."""
    events = [e for e in ledger.journal(run_id) if e.type is EventType.STEP_DONE]
    return [e.seq for e in events if e.key and e.key.startswith("turn")], next(
        e.seq for e in events if e.key == "setup"
    )


def _edit(ledger: cp.Ledger, edit: str, run_id: str, seq: int) -> None:
    if ledger.url.startswith("memory://"):
        texts = ledger.store._requests.setdefault(run_id, {})  # type: ignore[attr-defined]
        if edit == "alter":
            texts[seq] = texts[seq].replace("question", "QUESTION")
        elif edit == "delete":
            del texts[seq]
        else:
            texts[seq] = "{}"
    elif ledger.url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(ledger.url.removeprefix("sqlite:///"))) as conn:
            changed = conn.execute(_SQLITE[edit], (run_id, seq)).rowcount
            conn.commit()
        assert changed > 0
    else:
        import psycopg

        with psycopg.connect(ledger.url, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {ledger.store.schema}")  # type: ignore[attr-defined]
            assert conn.execute(_POSTGRES[edit], (run_id, seq)).rowcount == 1


def test_a_clean_ledger_passes(ledger: cp.Ledger) -> None:
    assert len(_seqs(ledger, "a")[0]) == 3
    assert ledger.check() == [("a", None), ("b", None), ("c", None)]


def test_altered_removed_and_added_texts_are_findings(ledger: cp.Ledger) -> None:
    turns, setup = _seqs(ledger, "a")
    _edit(ledger, "alter", "a", turns[1])
    _edit(ledger, "delete", "a", turns[2])
    _edit(ledger, "add", "a", setup)
    _edit(ledger, "delete", "c", _seqs(ledger, "c")[0][0])
    report = dict(ledger.check())
    assert report["b"] is None
    problem = report["a"]
    assert problem is not None
    assert problem.startswith("IntegrityError: run 'a': stored model requests do not match")
    assert f"the request of record {turns[1]}: altered" in problem
    assert f"the request of record {turns[2]}: missing" in problem
    assert f"the request of record {setup}: stored, yet its record names none" in problem
    assert "restore the ledger's requests from a backup" in problem
    assert "missing" in (report["c"] or "")
    assert ledger.check("b") == [("b", None)]


def test_a_ledger_without_stored_requests_passes(url: str) -> None:
    ledger = _ledger(url, store_requests=False)
    try:
        assert ledger.store.load_requests("a") == {}
        assert ledger.check() == [("a", None), ("b", None), ("c", None)]
        _edit(ledger, "add", "a", _seqs(ledger, "a")[1])  # a text no record names
        assert "stored, yet its record names none" in (dict(ledger.check())["a"] or "")
    finally:
        ledger.close()


def test_texts_of_records_appended_after_the_journal_was_read_are_no_strays(
    ledger: cp.Ledger,
) -> None:
    """A run driven while check reads it: the texts of records past the journal it read
    are matched against the journal read again."""
    events = ledger.journal("a")
    turns, _ = _seqs(ledger, "a")
    before = [e for e in events if e.seq < turns[1]]  # read before the last two turns
    check_requests(ledger.store, "a", before, lambda: events)  # no IntegrityError
    _edit(ledger, "alter", "a", turns[2])
    with pytest.raises(cp.IntegrityError, match=rf"record {turns[2]}: altered"):
        check_requests(ledger.store, "a", before, lambda: events)
