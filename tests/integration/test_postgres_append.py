"""The PostgreSQL journal append in one round trip (store/pg_append.py), on a real server:
counted on the wire (libpq's trace of what the client sends), and still refusing a
superseded fencing token, a taken seq and a missing run with the usual clear errors."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.store.port import BLOB_THRESHOLD

psycopg = pytest.importorskip("psycopg")

from crashproof.store.postgres import PostgresStore  # noqa: E402


def event(seq: int, value: str = '"x"', run_id: str = "r") -> Event:
    type_ = EventType.RUN_STARTED if seq == 0 else EventType.STEP_DONE
    return Event(
        run_id=run_id,
        seq=seq,
        type=type_,
        key=f"s{seq}",
        payload={"n": seq, "ü": "🙂"},
        value_json=value,
        created_at=1.5 + seq,
    )


def new_run(store: PostgresStore, run_id: str = "r") -> None:
    row = RunRow(
        run_id=run_id,
        workflow="wf",
        version="1",
        status=RunStatus.RUNNING,
        input_digest="d",
        created_at=1.0,
        updated_at=1.0,
    )
    assert store.create_run(row, event(0, run_id=run_id)) is None


class Wire:
    """libpq's trace of one pooled connection (F: what the client sends, B: what the
    server answers), to count round trips."""

    def __init__(self, store: PostgresStore, path: Path) -> None:
        self.path = path
        self._file = path.open("w")
        with store._pool.connection() as conn:  # the pool holds one connection (pool_size=1)
            conn.pgconn.trace(self._file.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

    def round_trips(self) -> int:
        """Runs of client messages: each one is sent, then the client waits for answers
        (libpq writes an answer to the trace only once it reads it, maybe later)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        lines = self.path.read_text().splitlines()
        sides = [line[0] for line in lines if line[:2] in ("F\t", "B\t")]
        return sum(1 for i, side in enumerate(sides) if side == "F" and sides[i - 1 : i] != ["F"])

    def close(self) -> None:
        self._file.close()


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    from crashproof.integrity.keys import Keyring
    from crashproof.integrity.seal import Sealer

    opened = PostgresStore(pg_url, pool_size=1, sealer=Sealer(Keyring(b"k" * 32)))
    yield opened
    opened.close()


def test_an_append_is_one_round_trip_once_the_journal_end_is_known(
    store: PostgresStore, pg_url: str
) -> None:
    new_run(store)  # the store knows where the journal ends: it wrote it

    lease = store.claim("r", "w1", 30.0)
    with tempfile.TemporaryDirectory() as directory:
        wire = Wire(store, Path(directory) / "trace")
        try:
            store.append([event(1)], fencing_token=lease.token)
            # The connection prepared the statement on first use (one round trip, once).
            assert wire.round_trips() == 2
            store.append([event(2)], fencing_token=lease.token)
            assert wire.round_trips() == 3
            # a status change, an output point (synchronous commit), a large value kept
            # as a blob: still one round trip each
            store.append([event(3)], (RunStatus.RUNNING, "why"), fencing_token=lease.token)
            store.append([event(4)], fencing_token=lease.token, durable=True)
            big = '"' + "b" * BLOB_THRESHOLD + '"'
            store.append([event(5, big)], fencing_token=lease.token)
            assert wire.round_trips() == 6
            # a batch of records: its own statement (prepared once), one round trip
            store.append([event(6, big), event(7), event(8, '"y"' + " " * BLOB_THRESHOLD)])
            store.append([event(9), event(10)], (RunStatus.RUNNING, "batch"))
            assert wire.round_trips() == 9
        finally:
            wire.close()
    got = store.load_events("r")  # every record verified against its seal on the way
    assert [e.seq for e in got] == list(range(11))
    assert got[5].value_json == big
    assert got[6].value_json == big
    assert got[8].value_json == '"y"' + " " * BLOB_THRESHOLD
    assert got[1].payload == {"n": 1, "ü": "🙂"}
    found = store.get_run("r")
    assert found is not None
    assert found.reason == "batch"

    # A store that has not read the run yet checks the journal's end first (two round
    # trips), then knows it.
    other = PostgresStore(pg_url, pool_size=1, sealer=store.sealer)
    try:
        with tempfile.TemporaryDirectory() as directory:
            wire = Wire(other, Path(directory) / "trace")
            try:
                other.append([event(11)])
                assert wire.round_trips() == 2
                other.append([event(12)])  # prepares the statement, then runs it
                other.append([event(13)])
                assert wire.round_trips() == 5
            finally:
                wire.close()
    finally:
        other.close()
    assert [e.seq for e in store.load_events("r")] == list(range(14))


def test_a_superseded_token_is_refused_and_nothing_is_kept(store: PostgresStore) -> None:
    new_run(store)
    old = store.claim("r", "w1", 30.0)
    store.append([event(1)], fencing_token=old.token)  # the end is now known
    new = store.claim("r", "w2", 30.0, take_over=True)
    big = '"' + "z" * BLOB_THRESHOLD + '"'
    with pytest.raises(cp.StaleLeaseError, match=rf"superseded by {new.token}\)"):
        store.append([event(2, big)], (RunStatus.SUCCEEDED, None), fencing_token=old.token)
    store.load_events("r")  # the end is known again: the one-statement path refuses too
    with pytest.raises(cp.StaleLeaseError, match=rf"superseded by {new.token}\)"):
        store.append([event(2, big), event(3)], fencing_token=old.token)  # a batch
    assert [e.seq for e in store.load_events("r")] == [0, 1]
    found = store.get_run("r")
    assert found is not None
    assert found.status is RunStatus.RUNNING
    with store._read() as cur:  # the refused record's blob was not kept either
        assert cur.execute("SELECT count(*) FROM crashproof.blobs").fetchone() == (0,)
    store.append([event(2)], (RunStatus.SUCCEEDED, None), fencing_token=new.token)
    found = store.get_run("r")
    assert found is not None
    assert found.status is RunStatus.SUCCEEDED


def test_a_seq_another_store_took_is_refused_with_the_usual_error(
    store: PostgresStore, pg_url: str
) -> None:
    new_run(store)
    store.append([event(1)])
    other = PostgresStore(pg_url, sealer=store.sealer)
    try:
        other.load_events("r")
        other.append([event(2, '"theirs"')])
    finally:
        other.close()
    # This store still believes the journal ends at 2.
    with pytest.raises(cp.StaleLeaseError, match="already taken or out of order"):
        store.append([event(2, '"mine"')])
    assert store.load_events("r")[2].value_json == '"theirs"'
    store.append([event(3)])  # having read the journal again, it goes on from there
    with pytest.raises(cp.StaleLeaseError, match="does not exist"):
        store.append([event(1, run_id="nope")])


def test_the_pool_size_comes_from_the_url_unless_given(pg_url: str) -> None:
    """A worker on PostgreSQL with more concurrent runs than 4 can size the pool in its
    --db URL; the Ledger (and its witness, on the same URL) open with it."""
    import crashproof as cp

    sized = f"{pg_url}{'&' if '?' in pg_url else '?'}pool_size=7"
    ledger = cp.Ledger(sized, key="42" * 32)
    try:
        assert ledger._store._pool.max_size == 7  # type: ignore[attr-defined]

        @ledger.workflow("sized", version="1")
        def flow(ctx: cp.Context) -> int:
            return int(ctx.step("one", lambda: 1))

        assert ledger.run(flow, run_id="sized") == 1
    finally:
        ledger.close()
    argument = PostgresStore(sized, pool_size=2)
    try:
        assert argument._pool.max_size == 2
    finally:
        argument.close()
    default = PostgresStore(pg_url)
    try:
        assert default._pool.max_size == 4
    finally:
        default.close()


@pytest.mark.parametrize("sealed", [True, False])
def test_a_record_of_an_unknown_type_is_named_not_parsed(pg_url: str, sealed: bool) -> None:
    """Records load with their payloads still text (parsed when read); a record of a type
    this version does not know is refused with its seq, sealed or not."""
    from crashproof.integrity.keys import Keyring
    from crashproof.integrity.seal import Sealer

    store = PostgresStore(
        pg_url, pool_size=1, sealer=Sealer(Keyring(b"k" * 32)) if sealed else None
    )
    try:
        new_run(store)
        store.append([event(1), event(2)])
        loaded = store.load_events("r")
        assert [e.payload for e in loaded[1:]] == [{"n": 1, "ü": "🙂"}, {"n": 2, "ü": "🙂"}]
        with store._pool.connection() as conn:
            conn.execute("UPDATE crashproof.events SET type = 'from_the_future' WHERE seq = 2")
        if sealed:  # the MAC covers the type: tampering, found before anything is parsed
            with pytest.raises(cp.IntegrityError, match="record 2"):
                store.load_events("r")
        else:
            with pytest.raises(cp.IntegrityError, match="event 2 is unreadable: unknown type"):
                store.load_events("r")
    finally:
        store.close()
