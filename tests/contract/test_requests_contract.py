"""A decision's request text kept beside its record (``KeptRequest``), on every store:
written in the record's transaction, so a refused or undone append keeps neither;
read back by run id (``Store.load_requests``), never by ``load_events``."""

from __future__ import annotations

import sqlite3

import pytest

from contract.test_store_contract import Backend, backend, event, row, start
from crashproof import StaleLeaseError
from crashproof.journal.records import Event, with_request
from crashproof.store.sqlite import SQLiteStore

__all__ = ["backend"]  # the fixture, imported from the store contract

REQUEST = '{"f":2,"args":[],"kwargs":{"messages":{"base":0,"new":[{"content":"héllo"}]}}}'


def kept(run_id: str, seq: int, text: str = REQUEST) -> Event:
    return with_request(event(run_id, seq, {"v": seq}), text)


def test_a_request_lands_with_its_record_and_reads_back_by_run(backend: Backend) -> None:
    store = backend.store
    first = start(store, "a")
    start(store, "b")
    store.append([kept("a", 1), event("a", 2)])
    store.append([kept("a", 3, REQUEST + " ")])
    store.append([kept("b", 1, "other")])
    assert store.load_requests("a") == {1: REQUEST, 3: REQUEST + " "}
    assert store.load_requests("b") == {1: "other"}
    assert store.load_requests("missing") == {}
    loaded = store.load_events("a")
    assert loaded == [first, event("a", 1, {"v": 1}), event("a", 2), event("a", 3, {"v": 3})]


def test_a_refused_append_keeps_neither_record_nor_request(backend: Backend) -> None:
    store = backend.store
    start(store, "a")
    store.append([event("a", 1)])
    with pytest.raises(StaleLeaseError):
        store.append([kept("a", 1)])  # a taken seq
    with pytest.raises(StaleLeaseError):
        store.append([kept("a", 2), event("a", 4)])  # a gap after it
    lease = store.claim("a", "w", 60)
    with pytest.raises(StaleLeaseError):
        store.append([kept("a", 2)], fencing_token=lease.token - 1)
    assert store.load_requests("a") == {}
    assert [e.seq for e in store.load_events("a")] == [0, 1]
    store.append([kept("a", 2)], fencing_token=lease.token)
    assert store.load_requests("a") == {2: REQUEST}


def test_a_batch_keeps_each_records_request_with_it(backend: Backend) -> None:
    store = backend.store
    batch = getattr(store, "append_batch", None)
    if batch is None:
        pytest.skip("this store has no batch commit")
    start(store, "a")
    start(store, "b")
    results = batch(
        [
            [(([kept("a", 1)]), None, None, False), (([kept("a", 5)]), None, None, False)],
            [(([kept("b", 1, "b1")]), None, None, False)],
        ]
    )
    assert results[0] is not None
    assert results[0][0] == 1
    assert results[1] is None
    assert store.load_requests("a") == {1: REQUEST}
    assert store.load_requests("b") == {1: "b1"}


def test_a_write_undone_after_its_record_landed_keeps_neither(tmp_path: object) -> None:
    # The request's own insert fails after the record's (its row is taken): the
    # transaction is undone whole, the record goes with it.
    path = tmp_path / "l.db"  # type: ignore[operator]
    store = SQLiteStore(path)
    try:
        store.create_run(row("a"), event("a", 0))
        with sqlite3.connect(path) as conn:
            run_no = conn.execute("SELECT run_no FROM runs WHERE run_id = 'a'").fetchone()[0]
            conn.execute(
                "INSERT INTO requests (id, text) VALUES (?, 'in the way')", ((run_no << 32) + 1,)
            )
        conn.close()
        with pytest.raises(StaleLeaseError):
            store.append([kept("a", 1)])
        assert [e.seq for e in store.load_events("a")] == [0]
        assert store.load_requests("a") == {1: "in the way"}
    finally:
        store.close()
