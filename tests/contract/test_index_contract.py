"""The run index of every store (crashproof.store.index): pages newest update first,
filters, a search that treats % and _ as text, counts, and the reserved runs left out."""

from __future__ import annotations

from dataclasses import replace

from contract.test_store_contract import Backend, backend, event, row
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.store.index import IndexQuery, RunIndex, outbox_index, run_index

__all__ = ["backend"]  # the fixture, imported from the store contract


def _index(backend: Backend) -> RunIndex:
    index = run_index(backend.store)
    assert index is not None
    return index


def _fill(backend: Backend) -> None:
    store = backend.store
    for n, (run_id, workflow) in enumerate(
        [("a-1", "wf"), ("b_2", "wf"), ("c%3", "other"), ("crashproof:approvers", "wf")]
    ):
        made = replace(row(run_id, created_at=100.0 + n), workflow=workflow)
        assert store.create_run(made, event(run_id, 0)) is None
    store.append([event("a-1", 1)], (RunStatus.SUCCEEDED, None))  # now the newest update


def test_pages_come_newest_update_first_without_the_reserved_runs(backend: Backend) -> None:
    _fill(backend)
    index = _index(backend)
    rows, total = index.index_page(IndexQuery(), 0, 10)
    assert total == 3
    assert [r.run_id for r in rows] == ["a-1", "c%3", "b_2"]
    rows, total = index.index_page(IndexQuery(), 1, 1)
    assert ([r.run_id for r in rows], total) == (["c%3"], 3)
    assert index.index_page(IndexQuery(), 5, 10) == ([], 3)


def test_filters_and_a_literal_search(backend: Backend) -> None:
    _fill(backend)
    index = _index(backend)
    done, n = index.index_page(IndexQuery(status=RunStatus.SUCCEEDED), 0, 10)
    assert ([r.run_id for r in done], n) == (["a-1"], 1)
    assert done[0].status is RunStatus.SUCCEEDED
    other, _ = index.index_page(IndexQuery(workflow="other"), 0, 10)
    assert [r.run_id for r in other] == ["c%3"]
    for needle, found in (("%", ["c%3"]), ("_", ["b_2"]), ("-", ["a-1"]), ("approvers", [])):
        rows, _ = index.index_page(IndexQuery(search=needle), 0, 10)
        assert [r.run_id for r in rows] == found, needle


def test_a_time_window_on_the_last_update(backend: Backend) -> None:
    _fill(backend)
    index = _index(backend)
    rows, _ = index.index_page(IndexQuery(), 0, 10)
    times = {r.run_id: r.updated_at for r in rows}
    middle = times["c%3"]
    since, n = index.index_page(IndexQuery(since=middle), 0, 10)
    assert ([r.run_id for r in since], n) == (["a-1", "c%3"], 2)
    until, n = index.index_page(IndexQuery(until=middle), 0, 10)
    assert ([r.run_id for r in until], n) == (["b_2"], 1)
    both, n = index.index_page(IndexQuery(since=middle, until=times["a-1"]), 0, 10)
    assert ([r.run_id for r in both], n) == (["c%3"], 1)


def test_summary_and_marks(backend: Backend) -> None:
    _fill(backend)
    index = _index(backend)
    counts, workflows = index.index_summary()
    assert counts == {"running": 2, "succeeded": 1}
    assert workflows == ["other", "wf"]
    marks = {run_id: (status, at) for run_id, status, at in index.index_marks()}
    assert set(marks) == {"a-1", "b_2", "c%3"}
    assert marks["a-1"][0] == "succeeded"
    assert marks["b_2"] == ("running", 101.0)


def _outbox_done(run_id: str, seq: int) -> Event:
    return Event(
        run_id=run_id,
        seq=seq,
        type=EventType.STEP_DONE,
        key=f"n{seq}",
        payload={
            "kind": "act",
            "status": "succeeded",
            "attempt": 1,
            "outbox": {"tool": "chat", "message": {"text": "hi"}},
        },
        value_json=None,
        created_at=1000.0 + seq,
    )


def test_outbox_runs_are_those_with_an_outbox_message(backend: Backend) -> None:
    _fill(backend)
    store = backend.store
    index = outbox_index(store)
    assert index is not None
    assert index.index_outbox_runs() == set()
    store.append([_outbox_done("b_2", 1)], None)
    store.append([_outbox_done("crashproof:approvers", 1)], None)  # reserved: left out
    # "outbox" in a step's value, not its payload: not a message
    store.append([event("c%3", 1, {"outbox": "outbox"})], None)
    assert index.index_outbox_runs() == {"b_2"}


def test_reconciled_runs_are_those_with_a_journaled_finding(backend: Backend) -> None:
    _fill(backend)
    store = backend.store
    index = outbox_index(store)
    assert index is not None
    assert index.index_reconciled_runs() == set()
    finding = Event(
        run_id="b_2",
        seq=1,
        type=EventType.ACT_RECONCILED,
        key="s1",
        payload={"by": "alice", "finding": "drifted"},
        created_at=1.0,
    )
    store.append([finding], None)
    assert index.index_reconciled_runs() == {"b_2"}
