"""The PostgreSQL batch append (PostgresBatchAppend.append_batch), on a real server: many
runs' records in one transaction and one round trip (counted on the wire), a refused
record costing only its own run's group, and every check of the single append kept."""

from __future__ import annotations

import tempfile
import threading
import time
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


def _intent(seq: int, run_id: str, digest: str, *, key: str = "act", **more: object) -> Event:
    payload = {"kind": "act", "intent_digest": digest, **more}
    return Event(run_id, seq, EventType.ACT_INTENT, key, payload, created_at=1.5 + seq)


def test_an_intent_held_by_another_run_is_refused_inside_the_batch_the_others_commit(
    store: PostgresStore,
) -> None:
    store.append([_intent(1, "a", "same")])  # a holds the intent (the checked path)
    with tempfile.TemporaryDirectory() as directory:
        wire = Wire(store, Path(directory) / "trace")
        try:
            results = store.append_batch(
                [
                    [([_intent(1, "b", "same")], None, None, True)],  # held by a: refused
                    [([_intent(1, "c", "own")], None, None, True)],  # a new hold: kept
                ]
            )
            # The holds are checked in the batch's one round trip; only the refused
            # record takes the checked path after it, which names the holder (its
            # read, its holds, its rollback and the deallocation that follows it).
            trips = wire.round_trips()
        finally:
            wire.close()
    assert trips <= 1 + 5
    assert results[1] is None
    assert results[0] is not None
    assert results[0][0] == 0
    assert isinstance(results[0][1], cp.IntentHeld)
    assert "run 'a'" in str(results[0][1])
    assert seqs(store, "b") == [0]  # nothing of b's refused record was kept
    assert seqs(store, "c") == [0, 1]
    holds = {(h.run_id, h.intent_digest) for h in store.unresolved_intents()}
    assert holds == {("a", "same"), ("c", "own")}


def test_new_holds_in_one_batch_are_one_round_trip(store: PostgresStore) -> None:
    with tempfile.TemporaryDirectory() as directory:
        wire = Wire(store, Path(directory) / "trace")
        try:
            results = store.append_batch(
                [[([_intent(1, r, f"d-{r}")], None, None, True)] for r in RUNS]
            )
            assert wire.round_trips() == 1
        finally:
            wire.close()
    assert results == [None] * 3
    assert sorted(h.run_id for h in store.unresolved_intents()) == list(RUNS)


def test_two_runs_of_one_batch_with_one_intent_only_the_first_holds_it(
    store: PostgresStore,
) -> None:
    results = store.append_batch(
        [
            [
                ([event(1, run_id="a")], None, None, False),
                ([_intent(2, "a", "x")], None, None, True),
            ],
            [([_intent(1, "b", "x")], None, None, True)],  # after a's hold, in the same batch
            [([event(1, run_id="c")], None, None, False)],
        ]
    )
    assert results[0] is None
    assert results[2] is None
    assert results[1] is not None
    assert isinstance(results[1][1], cp.IntentHeld)
    assert seqs(store, "a") == [0, 1, 2]
    assert seqs(store, "b") == [0]
    assert seqs(store, "c") == [0, 1]
    assert [(h.run_id, h.key) for h in store.unresolved_intents()] == [("a", "act")]


def test_a_batch_hold_passes_an_override_and_the_runs_own_step_again(
    store: PostgresStore,
) -> None:
    store.append([_intent(1, "a", "same")])
    results = store.append_batch(
        [
            # a's own act again (a retry): never refused by its own hold
            [([_intent(2, "a", "same")], None, None, True)],
            # b names a in its overrides (an operator's journaled override)
            [([_intent(1, "b", "same", overrides=["a"])], None, None, True)],
            # c names someone else: still refused
            [([_intent(1, "c", "same", overrides=["z"])], None, None, True)],
        ]
    )
    assert results[0] is None
    assert results[1] is None
    assert results[2] is not None
    assert isinstance(results[2][1], cp.IntentHeld)
    assert seqs(store, "a") == [0, 1, 2]
    assert seqs(store, "b") == [0, 1]
    assert seqs(store, "c") == [0]
    assert sorted(h.run_id for h in store.unresolved_intents()) == ["a", "b"]


def test_a_refused_hold_in_a_batch_holds_nothing(store: PostgresStore) -> None:
    old = store.claim("a", "w1", 30.0)
    store.claim("a", "w2", 30.0, take_over=True)
    results = store.append_batch(
        [
            [([_intent(1, "a", "x")], None, old.token, True)],  # a superseded lease
            [([_intent(1, "b", "y")], None, None, True)],
        ]
    )
    assert results[0] is not None
    assert isinstance(results[0][1], cp.StaleLeaseError)
    assert results[1] is None
    assert [h.run_id for h in store.unresolved_intents()] == ["b"]
    assert seqs(store, "a") == [0]


def test_two_batches_racing_for_one_intent_hold_it_once(store: PostgresStore, pg_url: str) -> None:
    other = PostgresStore(pg_url, pool_size=1, sealer=store.sealer)
    blocker = psycopg.connect(pg_url.split("?")[0], autocommit=True)
    try:
        other.load_events("b")  # the other store knows where b's journal ends
        # Both batches wait on the intent's lock while it is taken here, then go one
        # after the other: the second one's statement must see the first one's hold.
        blocker.execute("BEGIN")
        blocker.execute("SELECT pg_advisory_xact_lock(hashtextextended('raced', 0))")
        results: dict[str, list[tuple[int, Exception] | None]] = {}

        def batch(name: str, on: PostgresStore, run_id: str) -> None:
            results[name] = on.append_batch([[([_intent(1, run_id, "raced")], None, None, True)]])

        threads = [
            threading.Thread(target=batch, args=("a", store, "a")),
            threading.Thread(target=batch, args=("b", other, "b")),
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # both are waiting on the lock now
        blocker.execute("COMMIT")
        for thread in threads:
            thread.join(timeout=30)
    finally:
        blocker.close()
        other.close()
    outcomes = sorted((name, r[0] is None) for name, r in results.items())
    assert [ok for _name, ok in outcomes].count(True) == 1, outcomes
    refused = next(r[0] for r in results.values() if r[0] is not None)
    assert isinstance(refused[1], cp.IntentHeld)
    assert len(store.unresolved_intents()) == 1


def test_the_runs_first_records_share_one_statement_each_refused_on_its_own(
    store: PostgresStore,
) -> None:
    old = store.claim("b", "w1", 30.0)
    new = store.claim("b", "w2", 30.0, take_over=True)
    tokens = {"a": store.claim("a", "w1", 30.0).token, "c": None}
    big = '"' + "s" * BLOB_THRESHOLD + '"'  # the same blob in two runs of one batch
    results = store.append_batch(
        [
            [
                ([event(1, big, run_id="a")], None, tokens["a"], False),
                ([event(2, run_id="a")], None, tokens["a"], False),  # chained to the row
            ],
            [
                ([event(1, run_id="b")], None, old.token, False),  # a superseded lease
                ([event(2, run_id="b")], None, new.token, False),  # refused after it
            ],
            [([event(1, big, run_id="c")], None, None, True)],
        ]
    )
    assert results[0] is None
    assert results[2] is None
    assert results[1] is not None
    assert results[1][0] == 0
    assert isinstance(results[1][1], cp.StaleLeaseError)
    assert seqs(store, "a") == [0, 1, 2]
    assert seqs(store, "b") == [0]  # nothing of b was kept
    assert seqs(store, "c") == [0, 1]
    assert store.load_events("a")[1].value_json == big
    assert store.load_events("c")[1].value_json == big
    # b goes on under its current lease, from what was kept.
    assert store.append_batch([[([event(1, run_id="b")], None, new.token, False)]]) == [None]
    assert seqs(store, "b") == [0, 1]


def test_a_first_record_chained_to_a_stale_end_writes_nothing(
    store: PostgresStore, pg_url: str
) -> None:
    # Another store appends to b (seq 1) and this store's b record comes at seq 2 with a
    # MAC chained to a record it never saw: no taken seq, the chain check refuses it.
    other = PostgresStore(pg_url, sealer=store.sealer)
    try:
        other.load_events("b")
        other.append([event(1, '"theirs"', run_id="b")])
    finally:
        other.close()
    store._remember("b", 2, "not-the-mac")
    results = store.append_batch(
        [
            [([event(1, run_id="a")], None, None, False)],
            [([event(2, '"mine"', run_id="b")], None, None, False)],
        ]
    )
    assert results[0] is None
    assert results[1] is None  # the checked path then appended it after the real end
    events = store.load_events("b")  # verified: the chain holds
    assert [e.value_json for e in events[1:]] == ['"theirs"', '"mine"']


def test_a_runs_end_in_the_rows_statement_changes_status_and_releases_only_if_kept(
    store: PostgresStore,
) -> None:
    for run_id in RUNS:  # each run holds an intent (its own act)
        assert store.append_batch([[([_intent(1, run_id, f"d-{run_id}")], None, None, True)]]) == [
            None
        ]
    old = store.claim("b", "w1", 30.0)
    store.claim("b", "w2", 30.0, take_over=True)
    held_a = store.claim("a", "w1", 30.0)
    done = (RunStatus.SUCCEEDED, None)
    results = store.append_batch(
        [
            [([_act(2, EventType.RUN_SUCCEEDED, "a", key="")], done, held_a.token, True)],
            [([_act(2, EventType.RUN_SUCCEEDED, "b", key="")], done, old.token, True)],  # stale
            [([_act(2, EventType.STEP_DONE, "c")], None, None, False)],  # the act's end
        ]
    )
    assert results[0] is None
    assert results[2] is None
    assert results[1] is not None
    assert isinstance(results[1][1], cp.StaleLeaseError)
    statuses = {r: store.get_run(r).status for r in RUNS}  # type: ignore[union-attr]
    assert statuses == {
        "a": RunStatus.SUCCEEDED,
        "b": RunStatus.RUNNING,  # the refused record changed nothing
        "c": RunStatus.RUNNING,
    }
    assert [h.run_id for h in store.unresolved_intents()] == ["b"]
    assert seqs(store, "b") == [0, 1]
    leases = store.leases()
    assert leases["a"].owner is None  # the run's end released its lease, token kept
    assert leases["a"].token == held_a.token
    assert leases["b"].owner == "w2"  # the refused end released nothing
