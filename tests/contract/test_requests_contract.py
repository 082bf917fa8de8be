"""A decision's request text kept beside its record (``KeptRequest``), on every store:
written in the record's transaction, so a refused or undone append keeps neither;
read back by run id (``Store.load_requests``), never by ``load_events``."""

from __future__ import annotations

import pytest

from contract.test_store_contract import Backend, backend, event, start
from crashproof import LedgerError, StaleLeaseError
from crashproof.journal.records import Event, with_request
from crashproof.store.memory import MemoryStore

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


def test_a_write_undone_after_its_record_landed_keeps_neither(backend: Backend) -> None:
    # The request's own write fails after the record's (a text the database cannot
    # encode, a lone surrogate): the transaction is undone whole, the record with it.
    store = backend.store
    if isinstance(store, MemoryStore):
        pytest.skip("nothing in memory is encoded")
    start(store, "a")
    with pytest.raises(LedgerError, match="lone surrogate"):
        store.append([kept("a", 1, '{"f":1,"args":[{"v":"\ud800"}],"kwargs":{}}')])
    assert [e.seq for e in store.load_events("a")] == [0]
    assert store.load_requests("a") == {}
    store.append([kept("a", 1, REQUEST * 40)])  # parts of a long text come back whole
    assert store.load_requests("a") == {1: REQUEST * 40}


def test_a_value_the_database_cannot_take_refuses_its_own_run_only_in_a_batch(
    backend: Backend,
) -> None:
    # A step key with a lone surrogate (no UTF-8: neither store can write it) is b's own
    # refusal, a clear LedgerError; a's and c's records of the same batch are kept.
    store = backend.store
    batch = getattr(store, "append_batch", None)
    if batch is None or isinstance(store, MemoryStore):
        pytest.skip("nothing in memory is encoded")
    for run_id in ("a", "b", "c"):
        start(store, run_id)
    bad = with_request(event("b", 1, {"v": 1}, key="s\udcff"), REQUEST)
    results = batch(
        [
            [([kept("a", 1)], None, None, False)],
            [([bad], None, None, False), ([kept("b", 2)], None, None, False)],
            [([kept("c", 1)], None, None, True)],
        ]
    )
    assert results[0] is None
    assert results[2] is None
    assert results[1] is not None
    assert results[1][0] == 0
    assert isinstance(results[1][1], LedgerError)
    assert "lone surrogate" in str(results[1][1])
    assert [e.seq for e in store.load_events("b")] == [0]
    assert store.load_requests("b") == {}
    assert store.load_requests("a") == store.load_requests("c") == {1: REQUEST}
    assert batch([[([kept("b", 1)], None, None, False)]]) == [None]  # b goes on, fixed
