"""Decisions' request texts in the PostgreSQL batch append (PostgresBatchAppend.append_batch),
on a real server: several runs' decisions and their texts in one transaction and one
round trip (counted on the wire), each text read back matching the digest its record
holds, and a record the batch refuses keeping no text of its own."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import Event, EventType, RunStatus, request_sha256, with_request
from crashproof.runtime.operations.request_check import check_requests

from .test_postgres_append import Wire, event, new_run

psycopg = pytest.importorskip("psycopg")

from crashproof.store.postgres import PostgresStore  # noqa: E402

RUNS = ("a", "b", "c")


@pytest.fixture(params=["sealed", "unsealed"])
def store(pg_url: str, request: pytest.FixtureRequest) -> Iterator[PostgresStore]:
    from crashproof.integrity.keys import Keyring
    from crashproof.integrity.seal import Sealer

    sealer = Sealer(Keyring(b"k" * 32)) if request.param == "sealed" else None
    opened = PostgresStore(pg_url, pool_size=1, sealer=sealer)
    for run_id in RUNS:
        new_run(opened, run_id)  # the store knows where each journal ends: it wrote it
    yield opened
    opened.close()


def decision(seq: int, run_id: str, text: str | None = None) -> Event:
    """A decision's record naming its request's digest, to be appended with the text."""
    text = f'{{"messages":[{{"content":"{run_id} at {seq}: héllo 🙂"}}]}}' if text is None else text
    payload = {"kind": "decide", "request_sha256": request_sha256(text)}
    record = Event(run_id, seq, EventType.STEP_DONE, f"d{seq}", payload, 1.5 + seq, '"ok"')
    return with_request(record, text)


def verified(store: PostgresStore, run_id: str) -> dict[int, str]:
    """The run's kept texts, once each one matched the digest its (verified) record holds."""
    check_requests(store, run_id, store.load_events(run_id), lambda: store.load_events(run_id))
    return store.load_requests(run_id)


def test_several_runs_decisions_with_requests_are_one_round_trip(store: PostgresStore) -> None:
    tokens = {r: store.claim(r, "w1", 30.0).token for r in RUNS}
    long = "x" * 100_000  # a long conversation: one text, not split
    with tempfile.TemporaryDirectory() as directory:
        wire = Wire(store, Path(directory) / "trace")
        try:
            results = store.append_batch(
                [
                    [([decision(1, "a")], None, tokens["a"], False)],
                    [
                        ([event(1, run_id="b")], None, tokens["b"], False),
                        ([decision(2, "b", long)], None, tokens["b"], False),  # after the row
                        ([decision(3, "b"), event(4, run_id="b")], None, tokens["b"], False),
                    ],
                    [([decision(1, "c")], (RunStatus.RUNNING, "why"), tokens["c"], True)],
                ]
            )
            assert wire.round_trips() == 1
            # The next batch, its statements prepared: still one round trip.
            results += store.append_batch(
                [[([decision(s, r)], None, tokens[r], False)] for r, s in (("a", 2), ("c", 2))]
            )
            assert wire.round_trips() == 2
        finally:
            wire.close()
    assert results == [None] * 5
    assert sorted(verified(store, "a")) == [1, 2]
    assert verified(store, "b") == {2: long, 3: decision(3, "b").request_text}
    assert sorted(verified(store, "c")) == [1, 2]
    assert [e.seq for e in store.load_events("b")] == [0, 1, 2, 3, 4]
    found = store.get_run("c")
    assert found is not None
    assert found.reason == "why"


def test_a_decision_refused_in_a_batch_writes_no_text(store: PostgresStore) -> None:
    old = store.claim("b", "w1", 30.0)
    new = store.claim("b", "w2", 30.0, take_over=True)
    results = store.append_batch(
        [
            [([decision(1, "a")], None, None, False), ([decision(2, "a")], None, None, False)],
            [
                ([decision(1, "b")], None, old.token, False),  # a superseded lease
                ([decision(2, "b")], None, new.token, False),  # refused after it
            ],
            [
                ([decision(1, "c")], None, None, False),
                ([decision(2, "c")], None, old.token, False),  # c's own lease is not b's
                ([decision(3, "c")], None, None, False),
            ],
        ]
    )
    assert results[0] is None
    assert results[1] is not None
    assert results[1][0] == 0
    assert isinstance(results[1][1], cp.StaleLeaseError)
    assert results[2] is not None
    assert results[2][0] == 1
    assert isinstance(results[2][1], cp.StaleLeaseError)
    assert sorted(verified(store, "a")) == [1, 2]
    assert verified(store, "b") == {}  # neither record nor text
    assert [e.seq for e in store.load_events("b")] == [0]
    assert sorted(verified(store, "c")) == [1]  # the texts of the kept records only
    # b goes on under its current lease, from what was kept; its text with it.
    assert store.append_batch([[([decision(1, "b")], None, new.token, False)]]) == [None]
    assert sorted(verified(store, "b")) == [1]


def theirs_at_1(store: PostgresStore, pg_url: str) -> None:
    """Another store (another process) appends run b's decision at seq 1, "theirs"."""
    other = PostgresStore(pg_url, sealer=store.sealer)
    try:
        other.load_events("b")
        other.append([decision(1, "b", "theirs")])
    finally:
        other.close()


def test_a_decision_chained_to_a_stale_end_writes_its_text_only_where_it_lands(
    store: PostgresStore, pg_url: str
) -> None:
    # Another store appends to b (seq 1): this store's b decision, at seq 2, chains to an
    # end it never saw. The batch refuses it (no text kept from there), then the checked
    # path appends it after the real end, with its text.
    theirs_at_1(store, pg_url)
    store._remember("b", 2, "not-the-mac")
    results = store.append_batch(
        [
            [([decision(1, "a")], None, None, False)],
            [([decision(2, "b", "mine")], None, None, False)],
        ]
    )
    assert results == [None, None]
    assert verified(store, "b") == {1: "theirs", 2: "mine"}
    assert sorted(verified(store, "a")) == [1]


def test_a_seq_another_store_took_keeps_no_text_of_the_refused_decision(
    store: PostgresStore, pg_url: str
) -> None:
    theirs_at_1(store, pg_url)
    # This store still believes b's journal ends at 1: its statement meets a taken seq,
    # which undoes the whole transaction (the texts with it); each group then goes
    # through the checked path.
    results = store.append_batch(
        [
            [([decision(1, "a")], None, None, False)],
            [([decision(1, "b", "mine")], None, None, False)],
            [([decision(1, "c")], None, None, True)],
        ]
    )
    assert results[0] is None
    assert results[1] is not None
    assert isinstance(results[1][1], cp.StaleLeaseError)
    assert results[2] is None
    assert verified(store, "b") == {1: "theirs"}
    assert sorted(verified(store, "a")) == [1]
    assert sorted(verified(store, "c")) == [1]


def test_a_refused_decision_writes_no_text_beside_another_record_at_its_seq(
    store: PostgresStore, pg_url: str
) -> None:
    # Another store appends a record of its own at b's seq 1 (no request); this store's
    # decision at seq 1 chains to an end that is not b's: the batch's statement refuses
    # it (no taken seq is met), and the record at seq 1 is not its own, so no text may
    # go beside it. The checked path then finds the seq taken.
    other = PostgresStore(pg_url, sealer=store.sealer)
    try:
        other.load_events("b")
        other.append([event(1, '"theirs"', run_id="b")])
    finally:
        other.close()
    store._remember("b", 1, "not-the-mac")
    results = store.append_batch(
        [
            [([decision(1, "a")], None, None, False)],
            [([decision(1, "b", "mine")], None, None, False)],
        ]
    )
    assert results[0] is None
    assert results[1] is not None
    assert isinstance(results[1][1], cp.StaleLeaseError)
    assert store.load_requests("b") == {}
    assert store.load_events("b")[1].value_json == '"theirs"'
    assert sorted(verified(store, "a")) == [1]


@pytest.mark.parametrize("key", ["d\x00", "d\udcff"], ids=["NUL", "lone surrogate"])
def test_a_value_the_database_cannot_take_refuses_its_own_run_only(
    store: PostgresStore, key: str
) -> None:
    # PostgreSQL's text holds no NUL, UTF-8 no lone surrogate (a step key: a request text
    # is kept in a form it holds, store/request_texts.py): the batch's transaction is
    # undone and its runs go one by one, so b alone is refused (a clear LedgerError,
    # nothing of it kept) and a's and c's records land; the connection goes back clean.
    text = '{"f":1}'
    record = Event("b", 1, EventType.STEP_DONE, key, {"kind": "decide"}, 2.5, '"ok"')
    results = store.append_batch(
        [
            [([decision(1, "a")], None, None, False)],
            [([with_request(record, text)], None, None, False)],
            [([decision(1, "c")], None, None, True)],
        ]
    )
    assert results[0] is None
    assert results[2] is None
    assert results[1] is not None
    assert isinstance(results[1][1], cp.LedgerError)
    assert [len(store.load_events(r)) for r in RUNS] == [2, 1, 2]
    assert store.load_requests("b") == {}
    assert sorted(verified(store, "a")) == sorted(verified(store, "c")) == [1]
    store.append([decision(2, "a")])  # the same pooled connection, no transaction left open
    assert sorted(verified(store, "a")) == [1, 2]


def test_async_drives_deciding_together_keep_each_request_beside_its_record(
    pg_url: str, tmp_path: Path
) -> None:
    # The drives leave each decision together: their records (each with its request)
    # meet in shared batches, through the ledger's own commits (runtime/driving), each
    # batch one round trip on the store's one connection.
    runs, asks = 6, 3
    barrier = asyncio.Barrier(runs)

    async def ask(i: int) -> cp.Decision:
        await barrier.wait()
        return cp.Decision({"answer": i}, model="stub", usage={"total_tokens": 3})

    @cp.workflow("asker", version="1")
    async def asker(ctx: cp.AsyncContext, n: int) -> list[Any]:
        return [await ctx.decide("ask", ask, i) for i in range(n)]

    sep = "&" if "?" in pg_url else "?"
    with cp.Ledger(f"{pg_url}{sep}pool_size=1") as ledger:
        store = ledger._store
        if not isinstance(store, PostgresStore):
            raise TypeError(f"a PostgreSQL ledger's store, not {type(store).__name__}")
        wire = Wire(store, tmp_path / "trace")
        batches: list[tuple[int, int]] = []  # (groups holding a request, round trips)
        inner = store.append_batch

        def counted(groups: Any) -> Any:
            before = wire.round_trips()
            try:
                return inner(groups)
            finally:
                kept = sum(any(e.request_text for r in g for e in r[0]) for g in groups)
                batches.append((kept, wire.round_trips() - before))

        store.append_batch = counted  # type: ignore[method-assign]

        async def all_runs() -> list[Any]:
            return await asyncio.gather(*(ledger.run_async(asker, run_id=i, n=asks) for i in ids))

        ids = [f"r{k}" for k in range(runs)]
        try:
            results = asyncio.run(all_runs())
        finally:
            wire.close()
        assert max(kept for kept, _trips in batches) > 1, batches
        assert all(trips == 1 for _kept, trips in batches), batches
        for run_id in ids:
            assert sorted(verified(store, run_id)) == [
                e.seq for e in store.load_events(run_id) if e.mentions("request_sha256")
            ]
            assert len(store.load_requests(run_id)) == asks
    assert results == [[{"answer": i} for i in range(asks)]] * runs
