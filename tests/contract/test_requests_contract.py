"""A decision's request text kept beside its record (``KeptRequest``), on every store:
written in the record's transaction, so a refused or undone append keeps neither;
read back by run id (``Store.load_requests``), never by ``load_events``."""

from __future__ import annotations

import pytest

from contract.test_store_contract import Backend, backend, event, start
from crashproof import LedgerError, StaleLeaseError
from crashproof.journal.records import Event, EventType, request_sha256, with_request
from crashproof.runtime.operations.request_check import check_requests
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


# Texts no database keeps as they are: a NUL (PostgreSQL's text refuses it; SQLite's
# length() and substr(), which cut a text into its parts, stop at it), a lone surrogate
# (no UTF-8), a text that begins with a quote (as the form they are kept in does), and a
# NUL and a surrogate past the first part of a long text.
ODD = (
    '{"f":1,"args":[{"v":"a\x00b"}],"kwargs":{}}',
    '{"f":1,"args":[{"v":"\ud800"}],"kwargs":{}}',
    '"quoted" \\u0000',
    "x" * 1500 + "\x00" + "é" * 900 + "\udcff" + REQUEST,
)


def named(run_id: str, seq: int, text: str) -> Event:
    """A decision's record naming its request's digest, appended with the text."""
    payload = {"kind": "decide", "request_sha256": request_sha256(text)}
    record = Event(run_id, seq, EventType.STEP_DONE, f"d{seq}", payload, 1000.0 + seq, '"ok"')
    return with_request(record, text)


def test_a_text_no_database_keeps_as_it_is_comes_back_exactly(backend: Backend) -> None:
    # Kept losslessly on every store, alone and in a batch, and read back as the very
    # text whose digest its record holds: crashproof check finds nothing, the digests a
    # store streams for it are the texts' own.
    store = backend.store
    start(store, "a")
    for seq, text in enumerate(ODD, start=1):
        store.append([named("a", seq, text)])
    store.append([named("a", len(ODD) + 1, REQUEST * 40)])  # parts of a long text, whole
    expected = dict(enumerate(ODD, start=1)) | {len(ODD) + 1: REQUEST * 40}
    assert store.load_requests("a") == expected
    batch = getattr(store, "append_batch", None)
    if batch is not None:
        start(store, "b")
        start(store, "c")
        results = batch(
            [
                [([named("b", 1, ODD[0]), named("b", 2, ODD[1])], None, None, False)],
                [([named("c", s, t)], None, None, False) for s, t in enumerate(ODD, start=1)],
            ]
        )
        assert results == [None, None]
        assert store.load_requests("b") == dict(enumerate(ODD[:2], start=1))
        assert store.load_requests("c") == dict(enumerate(ODD, start=1))
    for run_id in ("a", "b", "c") if batch is not None else ("a",):
        events = store.load_events(run_id)
        check_requests(store, run_id, events, lambda r=run_id: store.load_events(r))
        digests = getattr(store, "request_digests", None)
        if digests is not None:
            texts = store.load_requests(run_id)
            assert digests(run_id) == {s: request_sha256(t) for s, t in texts.items()}


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
