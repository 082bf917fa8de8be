"""The PostgreSQL batch append (PostgresAppend.append_batch), on a real server: many
runs' records in one transaction and one round trip (counted on the wire), a refused
record costing only its own run's group, and every check of the single append kept."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.store.port import BLOB_THRESHOLD

from .test_postgres_append import Wire, event, new_run

psycopg = pytest.importorskip("psycopg")

from crashproof.store.postgres import PostgresStore  # noqa: E402

RUNS = ("a", "b", "c")


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    from crashproof.integrity.keys import Keyring
    from crashproof.integrity.seal import Sealer

    opened = PostgresStore(pg_url, pool_size=1, sealer=Sealer(Keyring(b"k" * 32)))
    for run_id in RUNS:
        new_run(opened, run_id)  # the store knows where each journal ends: it wrote it
    yield opened
    opened.close()


def seqs(store: PostgresStore, run_id: str) -> list[int]:
    # Read through a store that verifies every seal on the way.
    return [e.seq for e in store.load_events(run_id)]


def test_many_runs_records_are_one_round_trip(store: PostgresStore) -> None:
    tokens = {r: store.claim(r, "w1", 30.0).token for r in RUNS}
    big = '"' + "b" * BLOB_THRESHOLD + '"'
    with tempfile.TemporaryDirectory() as directory:
        wire = Wire(store, Path(directory) / "trace")
        try:
            results = store.append_batch(
                [
                    [([event(1, run_id="a")], None, tokens["a"], False)],
                    [
                        ([event(1, run_id="b")], None, tokens["b"], False),
                        ([event(2, big, run_id="b"), event(3, run_id="b")], None, None, True),
                    ],
                    [
                        ([event(1, run_id="c")], (RunStatus.RUNNING, "why"), tokens["c"], True),
                    ],
                ]
            )
            assert wire.round_trips() == 1
            # The next batch, its statements prepared: still one round trip.
            results += store.append_batch(
                [
                    [([event(s, run_id=r)], None, tokens[r], False)]
                    for r, s in zip(RUNS, (2, 4, 2), strict=True)
                ]
            )
            assert wire.round_trips() == 2
        finally:
            wire.close()
    assert results == [None] * 6
    assert seqs(store, "a") == [0, 1, 2]
    assert seqs(store, "b") == [0, 1, 2, 3, 4]
    assert seqs(store, "c") == [0, 1, 2]
    assert store.load_events("b")[2].value_json == big
    found = store.get_run("c")
    assert found is not None
    assert found.reason == "why"


def test_a_refused_record_costs_only_its_own_runs_group(store: PostgresStore) -> None:
    old = store.claim("b", "w1", 30.0)
    new = store.claim("b", "w2", 30.0, take_over=True)
    results = store.append_batch(
        [
            [
                ([event(1, run_id="a")], None, None, False),
                ([event(2, run_id="a")], None, None, False),
            ],
            [
                ([event(1, run_id="b")], None, new.token, False),
                ([event(2, run_id="b")], None, old.token, False),  # a superseded lease
                ([event(3, run_id="b")], None, new.token, False),  # skipped after it
            ],
            [
                ([event(1, run_id="c")], None, None, False),
                ([event(3, run_id="c")], None, None, False),  # a gap
            ],
        ]
    )
    assert results[0] is None
    assert results[1] is not None
    assert results[1][0] == 1
    assert isinstance(results[1][1], cp.StaleLeaseError)
    assert results[2] is not None
    assert results[2][0] == 1
    assert isinstance(results[2][1], cp.StaleLeaseError)
    assert seqs(store, "a") == [0, 1, 2]
    assert seqs(store, "b") == [0, 1]
    assert seqs(store, "c") == [0, 1]
    # Each run goes on from what was kept.
    assert store.append_batch(
        [
            [([event(3, run_id="a")], None, None, False)],
            [([event(2, run_id="c")], None, None, False)],
        ]
    ) == [None, None]
    assert seqs(store, "c") == [0, 1, 2]


def test_a_seq_another_store_took_undoes_the_transaction_then_refuses_only_its_run(
    store: PostgresStore, pg_url: str
) -> None:
    other = PostgresStore(pg_url, sealer=store.sealer)
    try:
        other.load_events("b")
        other.append([event(1, '"theirs"', run_id="b")])
    finally:
        other.close()
    # This store still believes b's journal ends at 1: its statement meets a taken seq,
    # which undoes the whole transaction; each group then goes through the checked path.
    results = store.append_batch(
        [
            [([event(1, run_id="a")], None, None, False)],
            [([event(1, '"mine"', run_id="b")], None, None, False)],
            [([event(1, run_id="c")], None, None, True)],
        ]
    )
    assert results[0] is None
    assert results[1] is not None
    assert isinstance(results[1][1], cp.StaleLeaseError)
    assert results[2] is None
    assert seqs(store, "a") == [0, 1]
    assert store.load_events("b")[1].value_json == '"theirs"'
    assert seqs(store, "c") == [0, 1]


def _act(seq: int, type_: EventType, run_id: str, key: str = "act") -> Event:
    payload = {"kind": "act", "intent_digest": f"d-{run_id}"}
    return Event(run_id, seq, type_, key, payload, created_at=1.5 + seq)


def test_an_acts_end_and_a_runs_end_release_their_holds_only_with_the_record(
    store: PostgresStore,
) -> None:
    old = store.claim("b", "w1", 30.0)
    for run_id in RUNS:  # each run holds an intent (the checked path: a new hold)
        store.append([_act(1, EventType.ACT_INTENT, run_id)])
    new = store.claim("b", "w2", 30.0, take_over=True)
    results = store.append_batch(
        [
            [([_act(2, EventType.STEP_DONE, "a")], None, None, False)],  # the act's end
            [([_act(2, EventType.STEP_DONE, "b")], None, old.token, False)],  # refused
            [([_act(2, EventType.RUN_SUCCEEDED, "c", key="")], None, None, True)],  # the run's
        ]
    )
    assert results[0] is None
    assert results[1] is not None
    assert isinstance(results[1][1], cp.StaleLeaseError)
    assert results[2] is None
    # The refused record released nothing: b's hold is still there.
    assert [h.run_id for h in store.unresolved_intents()] == ["b"]
    assert store.append_batch(
        [[([_act(2, EventType.STEP_DONE, "b")], None, new.token, False)]]
    ) == [None]
    assert store.unresolved_intents() == []
