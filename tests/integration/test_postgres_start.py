"""A run's start and lease on PostgreSQL, each one statement and one round trip (counted
on the wire): create_run, claim, renew, release and the witness's start, with every
refusal of the transactions they replace kept (nothing written)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.journal.records import RunRow, RunStatus
from crashproof.store.port import Lease

from .test_postgres_append import Wire, event

psycopg = pytest.importorskip("psycopg")

from crashproof.integrity.pg_witness import PostgresWitness  # noqa: E402
from crashproof.store.postgres import PostgresStore  # noqa: E402


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    from crashproof.integrity.keys import Keyring
    from crashproof.integrity.seal import Sealer

    opened = PostgresStore(pg_url, pool_size=1, sealer=Sealer(Keyring(b"k" * 32)))
    yield opened
    opened.close()


def row(run_id: str = "r", digest: str = "d") -> RunRow:
    return RunRow(
        run_id=run_id,
        workflow="wf",
        version="1",
        status=RunStatus.RUNNING,
        input_digest=digest,
        created_at=1.0,
        updated_at=1.0,
    )


def trips(store: PostgresStore, work: object) -> int:
    with tempfile.TemporaryDirectory() as directory:
        wire = Wire(store, Path(directory) / "trace")
        try:
            if callable(work):
                work()
            return wire.round_trips()
        finally:
            wire.close()


def test_create_run_is_one_round_trip_and_returns_an_existing_row(store: PostgresStore) -> None:
    # (Each statement is prepared on its first use: a round trip of its own, once.)
    store.create_run(row("warm"), event(0, run_id="warm"))
    store.append([event(1, run_id="warm")])
    assert trips(store, lambda: store.create_run(row(), event(0))) == 1
    assert [e.seq for e in store.load_events("r")] == [0]
    # Again (another input): the existing row back, nothing written.
    found: list[RunRow | None] = []
    assert trips(store, lambda: found.append(store.create_run(row(digest="e"), event(0)))) == 1
    assert found[0] is not None
    assert found[0].input_digest == "d"
    assert [e.seq for e in store.load_events("r")] == [0]
    # The next append goes on from the start record this store wrote (one round trip).
    assert trips(store, lambda: store.append([event(1)])) == 1


def test_a_blob_start_record_lands_with_its_row(store: PostgresStore) -> None:
    from crashproof.store.port import BLOB_THRESHOLD

    big = '"' + "b" * BLOB_THRESHOLD + '"'
    assert store.create_run(row(), event(0, big)) is None
    assert store.load_events("r")[0].value_json == big


def test_claim_renew_release_are_one_round_trip_each(store: PostgresStore) -> None:
    store.create_run(row(), event(0))
    store.create_run(row("warm"), event(0, run_id="warm"))
    warm = store.claim("warm", "w1", 30.0)  # (prepared on first use: a round trip, once)
    store.release("warm", store.renew("warm", warm))
    leases: list[Lease] = []
    assert trips(store, lambda: leases.append(store.claim("r", "w1", 30.0))) == 1
    lease = leases[0]
    assert lease.token == 1
    assert lease.previous_owner is None
    assert trips(store, lambda: leases.append(store.renew("r", lease))) == 1
    assert leases[1].expires_at >= lease.expires_at
    assert trips(store, lambda: store.release("r", lease)) == 1
    again = store.claim("r", "w2", 30.0)
    assert again.token == 2
    assert again.previous_owner is None  # released


def test_a_refused_claim_writes_nothing(store: PostgresStore) -> None:
    store.create_run(row(), event(0))
    first = store.claim("r", "w1", 30.0)
    with pytest.raises(cp.LeaseHeld) as held:
        store.claim("r", "w2", 30.0)
    assert held.value.owner == "w1"
    assert store.leases()["r"].token == first.token  # no token spent
    # The same owner again, and an explicit take-over, are let in.
    assert store.claim("r", "w1", 30.0).token == first.token + 1
    taken = store.claim("r", "w2", 30.0, take_over=True)
    assert taken.token == first.token + 2
    assert taken.previous_owner == "w1"
    assert taken.previous_live
    with pytest.raises(cp.RunNotFound):
        store.claim("nope", "w1", 30.0)
    # A superseded lease renews and releases nothing.
    with pytest.raises(cp.StaleLeaseError):
        store.renew("r", first)
    store.release("r", first)
    assert store.leases()["r"].owner == "w2"


def test_an_expired_lease_is_claimed_by_the_servers_clock(store: PostgresStore) -> None:
    store.create_run(row(), event(0))
    store.claim("r", "w1", 0.0)
    taken = store.claim("r", "w2", 30.0)
    assert taken.previous_owner == "w1"
    assert not taken.previous_live


def test_the_witness_starts_a_new_run_in_one_statement(pg_url: str) -> None:
    witness = PostgresWitness(pg_url, schema="crashproof_witness")
    try:
        assert witness.start_unseen("r") is None
        assert witness.get("r") == 0
        assert witness.start_unseen("r") == 0  # seen at 0: nothing changed
        witness.advance("r", 3)
        assert witness.start_unseen("r") == 3  # (the caller refuses it: lost)
        assert witness.get("r") == 3
    finally:
        witness.close()


def _at_once(work: list[object]) -> list[object]:
    """Run the callables of ``work`` in threads started together; their results or errors."""
    barrier = threading.Barrier(len(work))

    def run(fn: object) -> object:
        barrier.wait()
        try:
            return fn() if callable(fn) else None
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(work)) as pool:
        return list(pool.map(run, work))


def test_concurrent_claims_of_one_run_let_one_owner_in(pg_url: str) -> None:
    store = PostgresStore(pg_url, pool_size=8)
    try:
        store.create_run(row(), event(0))
        for _round in range(5):
            got = _at_once([lambda o=o: store.claim("r", f"w{o}", 30.0) for o in range(12)])
            leases = [g for g in got if isinstance(g, Lease)]
            refused = [g for g in got if isinstance(g, cp.LeaseHeld)]
            assert len(leases) == 1, got
            assert len(refused) == 11
            store.release("r", leases[0])
    finally:
        store.close()


def test_concurrent_claims_of_many_runs_share_statements_refusing_each_on_its_own(
    pg_url: str,
) -> None:
    store = PostgresStore(pg_url, pool_size=8)
    try:
        for k in range(20):
            store.create_run(row(f"r{k}"), event(0, run_id=f"r{k}"))
        held = store.claim("r3", "other", 30.0)
        got = _at_once(
            [lambda k=k: store.claim(f"r{k}", "w1", 30.0) for k in range(20)]
            + [lambda: store.claim("nope", "w1", 30.0)]
        )
        assert isinstance(got[3], cp.LeaseHeld)
        assert isinstance(got[20], cp.RunNotFound)
        assert all(isinstance(g, Lease) and g.token == 1 for k, g in enumerate(got[:20]) if k != 3)
        leases = store.leases()
        assert leases["r3"].owner == "other"
        assert leases["r3"].token == held.token  # the refused claim wrote nothing
        # Released together: each by its own token.
        _at_once(
            [lambda k=k, g=g: store.release(f"r{k}", g) for k, g in enumerate(got[:20]) if k != 3]
            + [lambda: store.release("r3", Lease("w1", 99, 0.0, 30.0))]  # not the holder
        )
        leases = store.leases()
        assert leases["r3"].owner == "other"
        assert all(leases[f"r{k}"].owner is None for k in range(20) if k != 3)
    finally:
        store.close()


def test_concurrent_starts_of_one_run_create_it_once(pg_url: str) -> None:
    store = PostgresStore(pg_url, pool_size=8)
    try:
        got = _at_once([lambda: store.create_run(row(), event(0)) for _ in range(10)])
        assert got.count(None) == 1, got  # created once; the others see the row
        assert all(isinstance(g, RunRow) for g in got if g is not None)
        assert [e.seq for e in store.load_events("r")] == [0]
    finally:
        store.close()


def test_a_value_the_database_refuses_fails_only_its_own_start(pg_url: str) -> None:
    store = PostgresStore(pg_url, pool_size=8)
    try:
        runs = [f"r{k}" for k in range(10)] + ["bad\x00id"]
        got = _at_once([lambda r=r: store.create_run(row(r), event(0, run_id=r)) for r in runs])
        assert got[:10] == [None] * 10
        assert isinstance(got[10], cp.LedgerError)
        assert "NUL" in str(got[10])
        assert sorted(r.run_id for r in store.list_runs()) == sorted(runs[:10])
    finally:
        store.close()


def test_concurrent_witness_starts_share_a_statement(pg_url: str) -> None:
    witness = PostgresWitness(pg_url, schema="crashproof_witness")
    try:
        witness.start_unseen("seen")
        witness.advance("seen", 2)
        got = _at_once(
            [lambda k=k: witness.start_unseen(f"r{k}") for k in range(12)]
            + [lambda: witness.start_unseen("seen")]
        )
        assert got == [None] * 12 + [2]
        known = witness.known()
        assert all(known[f"r{k}"] == 0 for k in range(12))
        assert known["seen"] == 2
    finally:
        witness.close()


def test_a_refused_append_leaves_the_connections_prepared_statements_usable(
    store: PostgresStore,
) -> None:
    """A refusal on the checked path rolls its transaction back; psycopg then empties its
    cache of prepared statements. A ROLLBACK queued in the pipeline deferred the server's
    DEALLOCATE ALL past the next statement it prepared, whose next use then failed
    ("prepared statement _pg3_5 does not exist"): the one connection here sees it."""
    store.create_run(row(), event(0))
    old = store.claim("r", "w1", 30.0)
    new = store.claim("r", "w2", 30.0, take_over=True)
    for _attempt in range(3):
        with pytest.raises(cp.StaleLeaseError):
            store.append([event(1)], fencing_token=old.token)  # refused: checked path
        for _use in range(3):  # prepared on first use, then used again
            found = store.get_run("r")
            assert found is not None
            assert store.claim("r", "w2", 30.0).token > new.token
    store.append([event(1)], fencing_token=store.leases()["r"].token)
    assert [e.seq for e in store.load_events("r")] == [0, 1]


def test_a_new_run_created_under_its_first_lease_in_the_shared_statement(
    store: PostgresStore,
) -> None:
    lease = Lease("w1", 1, 0.0, 30.0)
    assert store.create_run(row(), event(0), lease) is None
    held = store.leases()["r"]
    assert (held.owner, held.token) == ("w1", 1)
    with pytest.raises(cp.LeaseHeld):  # held, by the server's clock, as a claim leaves it
        store.claim("r", "w2", 30.0)
    assert store.create_run(row("s"), event(0, run_id="s")) is None
    assert store.leases()["s"].owner is None
