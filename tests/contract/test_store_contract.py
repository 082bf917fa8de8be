"""One contract for the storage port, run against every store implementation.

To add a backend, add one entry to ``BACKENDS``: a function that opens a fresh, empty
store (in a given directory, or on a server it gets from a session fixture through
``request``) and knows how to count its blobs. PostgreSQL runs on a server the tests
start themselves (tests/postgres_server.py); it is skipped locally without the binaries.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from crashproof import LeaseHeld, RunNotFound, StaleLeaseError
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.store.memory import MemoryStore
from crashproof.store.port import BLOB_THRESHOLD, Lease, Store
from crashproof.store.sqlite import SQLiteStore

# -- backends ----------------------------------------------------------------


@dataclass
class Backend:
    """A store under test plus the one thing the port does not expose: its blob count."""

    store: Store
    blob_count: Callable[[], int]


def _memory(_request: pytest.FixtureRequest, _directory: Path) -> Backend:
    store = MemoryStore()
    return Backend(store, lambda: len(store.blobs))


def _sqlite(_request: pytest.FixtureRequest, directory: Path) -> Backend:
    path = directory / "contract.db"
    store = SQLiteStore(path, durability="output")

    def blob_count() -> int:
        # A second connection sees what was committed, nothing else.
        with sqlite3.connect(path) as conn:
            count: int = conn.execute("SELECT count(*) FROM blobs").fetchone()[0]
        conn.close()
        return count

    return Backend(store, blob_count)


def _postgres(request: pytest.FixtureRequest, _directory: Path) -> Backend:
    from crashproof.store.postgres import PostgresStore  # needs psycopg: imported here

    url = request.getfixturevalue("pg_url")  # a fresh database for every test
    # Hypothesis opens a store per example within one test: the first one gets the default
    # schema, each later one a fresh schema of its own (cheaper than a database each).
    opened = request.node.stash.get(_PG_STORES, 0)
    request.node.stash[_PG_STORES] = opened + 1
    schema = "crashproof" if opened == 0 else f"crashproof_{opened}"
    store = PostgresStore(url, durability="output", schema=schema)
    server = request.getfixturevalue("pg_server")

    def blob_count() -> int:
        # Another connection sees what was committed, nothing else.
        return int(server.query(url, f"SELECT count(*) FROM {schema}.blobs")[0][0])

    return Backend(store, blob_count)


_PG_STORES = pytest.StashKey[int]()

BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": _postgres,
}
# Each PostgreSQL example opens a pool and migrates a schema on a real server (~0.3 s):
# fewer examples, same rules.
MAX_EXAMPLES = {"postgres": 20}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    opened = BACKENDS[request.param](request, tmp_path)
    yield opened
    opened.store.close()


# -- records -----------------------------------------------------------------

BIG = "x" * BLOB_THRESHOLD  # JSON of a string is 2 longer: comfortably past the threshold


def row(run_id: str, *, created_at: float = 1000.0, digest: str = "d" * 64) -> RunRow:
    return RunRow(
        run_id=run_id,
        workflow="wf",
        version="1",
        status=RunStatus.RUNNING,
        input_digest=digest,
        created_at=created_at,
        updated_at=created_at,
    )


def event(run_id: str, seq: int, value: Any = None, *, key: str | None = None) -> Event:
    if seq == 0:
        type_ = EventType.RUN_STARTED
    else:
        type_ = EventType.STEP_DONE
        key = key or f"s{seq}"
    return Event(
        run_id=run_id,
        seq=seq,
        type=type_,
        key=key,
        payload={"kind": "step", "status": "succeeded", "attempt": 1, "n": [seq, 1.5, None]},
        value_json=None if value is None else json.dumps(value, ensure_ascii=False),
        created_at=1000.0 + seq / 7,
    )


def start(store: Store, run_id: str, *, created_at: float = 1000.0) -> Event:
    first = event(run_id, 0, {"input": run_id})
    if store.create_run(row(run_id, created_at=created_at), first) is not None:
        raise AssertionError("create_run of a new run must return None")
    return first


# -- create / get / list -----------------------------------------------------


def test_create_run_then_get_it(backend: Backend) -> None:
    store = backend.store
    first = event("r1", 0, {"repo": "x"})
    assert store.create_run(row("r1"), first) is None
    assert store.get_run("r1") == row("r1")
    assert store.load_events("r1") == [first]


def test_create_run_twice_returns_the_existing_row_and_writes_nothing(backend: Backend) -> None:
    store = backend.store
    first = event("r1", 0, {"repo": "x"})
    store.create_run(row("r1"), first)
    other_row = replace(row("r1", created_at=5.0, digest="e" * 64), workflow="other")
    other_first = event("r1", 0, {"repo": "changed", "big": BIG})

    existing = store.create_run(other_row, other_first)

    assert existing == row("r1")
    assert store.get_run("r1") == row("r1")
    assert store.load_events("r1") == [first]
    assert backend.blob_count() == 0


def test_unknown_run_reads_as_absent(backend: Backend) -> None:
    assert backend.store.get_run("nope") is None
    assert backend.store.load_events("nope") == []
    assert backend.store.list_runs() == []


def test_list_runs_oldest_first_ties_by_run_id(backend: Backend) -> None:
    store = backend.store
    for run_id, created in [("c", 3.0), ("b", 1.0), ("z", 2.0), ("a", 2.0)]:
        start(store, run_id, created_at=created)
    assert [r.run_id for r in store.list_runs()] == ["b", "a", "z", "c"]


def test_list_runs_by_status(backend: Backend) -> None:
    store = backend.store
    for i, run_id in enumerate(["r1", "r2", "r3", "r4"]):
        start(store, run_id, created_at=float(10 - i))
    store.append([event("r2", 1, "ok")], (RunStatus.SUCCEEDED, None))
    store.append([event("r4", 1, "ok")], (RunStatus.SUCCEEDED, None))
    store.append([event("r3", 1, "x")], (RunStatus.NEEDS_REVIEW, "drift"))

    assert [r.run_id for r in store.list_runs(RunStatus.SUCCEEDED)] == ["r4", "r2"]
    assert [r.run_id for r in store.list_runs(RunStatus.RUNNING)] == ["r1"]
    assert [r.run_id for r in store.list_runs(RunStatus.NEEDS_REVIEW)] == ["r3"]
    assert store.list_runs(RunStatus.FAILED) == []
    assert [r.run_id for r in store.list_runs()] == ["r4", "r3", "r2", "r1"]


def test_schema_version_is_positive(backend: Backend) -> None:
    assert backend.store.schema_version() >= 1


# -- append ------------------------------------------------------------------


def test_append_consecutive_without_status_change(backend: Backend) -> None:
    store = backend.store
    first = start(store, "r1")
    batch1 = [event("r1", 1, {"a": 1})]
    batch2 = [event("r1", 2, [1, 2]), event("r1", 3, "three"), event("r1", 4)]
    store.append(batch1)
    store.append(batch2)

    assert store.load_events("r1") == [first, *batch1, *batch2]
    found = store.get_run("r1")
    assert found is not None
    assert found.status is RunStatus.RUNNING
    assert found.reason is None


def test_append_with_status_change_lands_together(backend: Backend) -> None:
    store = backend.store
    first = start(store, "r1")
    batch = [event("r1", 1, "a"), event("r1", 2, "b")]
    store.append(batch, (RunStatus.NEEDS_REVIEW, "code changed"))

    found = store.get_run("r1")
    assert found is not None
    assert (found.status, found.reason) == (RunStatus.NEEDS_REVIEW, "code changed")
    assert found.created_at == row("r1").created_at
    assert found.input_digest == row("r1").input_digest
    assert store.load_events("r1") == [first, *batch]

    store.append([event("r1", 3, "c")], (RunStatus.SUCCEEDED, None))
    found = store.get_run("r1")
    assert found is not None
    assert (found.status, found.reason) == (RunStatus.SUCCEEDED, None)


def test_empty_append_is_a_no_op(backend: Backend) -> None:
    first = start(backend.store, "r1")
    backend.store.append([], (RunStatus.FAILED, "x"))
    assert backend.store.load_events("r1") == [first]
    found = backend.store.get_run("r1")
    assert found is not None
    assert found.status is RunStatus.RUNNING


@pytest.mark.parametrize(
    "seqs",
    [
        pytest.param([1], id="taken"),
        pytest.param([0], id="taken-first"),
        pytest.param([3, 4], id="gap"),
        pytest.param([2, 2], id="repeated-in-batch"),
        pytest.param([2, 4], id="gap-in-batch"),
        pytest.param([3, 2], id="reordered"),
        pytest.param([2, 3, 1], id="taken-last"),
    ],
)
def test_append_with_a_bad_seq_raises_and_keeps_nothing(backend: Backend, seqs: list[int]) -> None:
    store = backend.store
    first = start(store, "r1")
    one = event("r1", 1, "one")
    store.append([one])
    before_row = store.get_run("r1")
    blobs_before = backend.blob_count()

    batch = [event("r1", seq, {"big": BIG, "seq": seq}) for seq in seqs]
    with pytest.raises(StaleLeaseError):
        store.append(batch, (RunStatus.SUCCEEDED, "should not land"))

    assert store.load_events("r1") == [first, one]
    assert store.get_run("r1") == before_row
    assert backend.blob_count() == blobs_before
    # The store is still usable: the right seq goes through.
    store.append([event("r1", 2, "two")])
    assert [e.seq for e in store.load_events("r1")] == [0, 1, 2]


def test_append_to_a_missing_run_raises_and_keeps_nothing(backend: Backend) -> None:
    with pytest.raises(StaleLeaseError):
        backend.store.append([event("ghost", 1, "x")])
    assert backend.store.load_events("ghost") == []
    assert backend.store.get_run("ghost") is None


def test_append_of_events_of_two_runs_raises_and_keeps_nothing(backend: Backend) -> None:
    store = backend.store
    first1, first2 = start(store, "r1"), start(store, "r2")
    with pytest.raises(StaleLeaseError):
        store.append([event("r1", 1, "a"), event("r2", 2, "b")])
    assert store.load_events("r1") == [first1]
    assert store.load_events("r2") == [first2]


def test_runs_have_separate_journals(backend: Backend) -> None:
    store = backend.store
    first1, first2 = start(store, "r1"), start(store, "r2")
    a, b = event("r1", 1, "a"), event("r2", 1, "b")
    store.append([a])
    store.append([b])
    assert store.load_events("r1") == [first1, a]
    assert store.load_events("r2") == [first2, b]


# -- values ------------------------------------------------------------------


def test_load_events_returns_exactly_what_was_appended(backend: Backend) -> None:
    store = backend.store
    first = start(store, "r1")
    events = [
        Event(
            run_id="r1",
            seq=1,
            type=EventType.ATTEMPT_FAILED,
            key="turn#2",
            payload={"error": {"type": "builtins.ValueError", "message": "no"}, "x": [True]},
            value_json=None,
            created_at=1722.123456789,
        ),
        Event(
            run_id="r1",
            seq=2,
            type=EventType.RUN_FROZEN,
            key=None,
            payload={},
            value_json="null",
            created_at=0.1 + 0.2,
        ),
    ]
    store.append(events)
    loaded = store.load_events("r1")
    assert loaded == [first, *events]
    assert loaded[2].value is None
    assert loaded[2].value_json == "null"


def test_load_events_without_results_drops_only_step_results(backend: Backend) -> None:
    store = backend.store
    first = start(store, "r1")
    done = Event(
        run_id="r1",
        seq=3,
        type=EventType.RUN_SUCCEEDED,
        key=None,
        payload={},
        value_json='{"done":true}',
        created_at=1.0,
    )
    store.append([event("r1", 1, {"text": BIG}), event("r1", 2, {"x": 1}), done])
    full = store.load_events("r1")
    lean = store.load_events("r1", results=False)
    assert [(e.seq, e.type, e.key, e.payload, e.created_at) for e in lean] == [
        (e.seq, e.type, e.key, e.payload, e.created_at) for e in full
    ]
    assert lean[0].value == first.value  # the input: kept
    assert lean[-1].value == {"done": True}  # the run's result: kept
    kept = isinstance(store, MemoryStore)  # (in memory already: nothing to save)
    assert [e.value_json for e in lean[1:3]] == (
        [e.value_json for e in full[1:3]] if kept else [None, None]
    )


def test_large_values_round_trip_and_equal_ones_are_stored_once(backend: Backend) -> None:
    store = backend.store
    first1, first2 = start(store, "r1"), start(store, "r2")
    big = {"text": BIG, "n": 1}
    other = {"text": BIG, "n": 2}
    small = {"text": "short"}
    batch1 = [event("r1", 1, big), event("r1", 2, small), event("r1", 3, big)]
    batch2 = [event("r2", 1, big), event("r2", 2, other)]
    assert all(len(e.value_json or "") >= BLOB_THRESHOLD for e in (batch1[0], batch2[1]))
    store.append(batch1)
    store.append(batch2)

    assert store.load_events("r1") == [first1, *batch1]
    assert store.load_events("r2") == [first2, *batch2]
    assert [e.value for e in store.load_events("r2")[1:]] == [big, other]
    assert backend.blob_count() == 2


def test_a_value_just_below_the_threshold_is_not_a_blob(backend: Backend) -> None:
    store = backend.store
    start(store, "r1")
    value = "y" * (BLOB_THRESHOLD - 3)  # its JSON is BLOB_THRESHOLD - 1 long
    store.append([event("r1", 1, value)])
    assert store.load_events("r1")[1].value == value
    assert backend.blob_count() == 0


UNICODE_VALUES = [
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🧪🚀 and ZWJ 👩‍👩‍👧",
    "rtl עברית العربية",
    "combining e\u0301 and nul \u0000 and tab\t",
    {"ключ": ["значение", "🙂" * 300]},
    {"clé": "🙂" * BLOB_THRESHOLD},
]


@pytest.mark.parametrize("value", UNICODE_VALUES)
def test_unicode_values_round_trip(backend: Backend, value: Any) -> None:
    store = backend.store
    start(store, "r1")
    unicode_event = event("r1", 1, value)._replace(key="ключ#2", payload={"ü": "ß 🙂"})
    store.append([unicode_event])
    loaded = store.load_events("r1")[1]
    assert loaded == unicode_event
    assert loaded.value == value


# -- property: random journals round-trip ------------------------------------

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# A few big values that recur, so that equal blobs meet, plus fresh big ones.
SHARED_BIG = [BIG, "é" * BLOB_THRESHOLD, {"doc": "🙂" * (BLOB_THRESHOLD // 2)}]
BIG_JSON = st.sampled_from(SHARED_BIG) | st.builds(
    lambda unit, n: unit * n,
    st.text(min_size=1, max_size=4),
    st.integers(min_value=BLOB_THRESHOLD, max_value=BLOB_THRESHOLD + 50),
)
VALUES = st.one_of(st.just(None), JSON, BIG_JSON)
STATUS = st.none() | st.tuples(st.sampled_from(RunStatus), st.none() | st.text(max_size=20))


class StoreMachine(RuleBasedStateMachine):
    """The store against a trivial model: a dict of journals and a dict of statuses."""

    factory: Callable[[Path], Backend]  # a BACKENDS entry with the test's request bound

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.backend = self.factory(Path(self._tmp.name))
        self.journals: dict[str, list[Event]] = {}
        self.status: dict[str, tuple[RunStatus, str | None]] = {}

    @initialize()
    def one_run(self) -> None:
        self.create("run-0")

    @rule(run_id=st.sampled_from(["run-0", "run-1", "rün-2"]))
    def create(self, run_id: str) -> None:
        first = event(run_id, 0, {"id": run_id})
        existing = self.backend.store.create_run(row(run_id), first)
        if run_id in self.journals:
            assert existing is not None
            assert existing.run_id == run_id
        else:
            assert existing is None
            self.journals[run_id] = [first]
            self.status[run_id] = (RunStatus.RUNNING, None)

    @rule(
        data=st.data(),
        values=st.lists(VALUES, min_size=1, max_size=3),
        status=STATUS,
    )
    def append(self, data: st.DataObject, values: list[Any], status: Any) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.journals)))
        journal = self.journals[run_id]
        batch = [
            event(run_id, len(journal) + i, value, key=f"k{len(journal) % 3}")
            for i, value in enumerate(values)
        ]
        self.backend.store.append(batch, status)
        journal.extend(batch)
        if status is not None:
            self.status[run_id] = status

    @precondition(lambda self: any(len(j) > 1 for j in self.journals.values()))
    @rule(data=st.data(), value=VALUES)
    def append_stale(self, data: st.DataObject, value: Any) -> None:
        run_id = data.draw(
            st.sampled_from(sorted(r for r, j in self.journals.items() if len(j) > 1))
        )
        seq = data.draw(st.integers(min_value=0, max_value=len(self.journals[run_id]) - 1))
        with pytest.raises(StaleLeaseError):
            self.backend.store.append([event(run_id, seq, value)], (RunStatus.FAILED, "stale"))

    @invariant()
    def journals_round_trip(self) -> None:
        for run_id, journal in self.journals.items():
            loaded = self.backend.store.load_events(run_id)
            assert loaded == journal
            assert [e.value for e in loaded] == [e.value for e in journal]

    @invariant()
    def statuses_match(self) -> None:
        for run_id, (status, reason) in self.status.items():
            found = self.backend.store.get_run(run_id)
            assert found is not None
            assert (found.status, found.reason) == (status, reason)

    @invariant()
    def each_big_value_is_stored_once(self) -> None:
        big = {
            e.value_json
            for journal in self.journals.values()
            for e in journal
            if e.value_json is not None and len(e.value_json) >= BLOB_THRESHOLD
        }
        assert self.backend.blob_count() == len(big)

    def teardown(self) -> None:
        self.backend.store.close()
        self._tmp.cleanup()


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_random_journals_round_trip(name: str, request: pytest.FixtureRequest) -> None:
    factory = functools.partial(BACKENDS[name], request)
    machine = type(f"StoreMachine_{name}", (StoreMachine,), {"factory": staticmethod(factory)})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=MAX_EXAMPLES.get(name, 40),
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- leases and fencing ------------------------------------------------------


def test_claim_of_a_free_run_sets_owner_expiry_and_the_first_token(backend: Backend) -> None:
    start(backend.store, "r")
    before = time.time()
    lease = backend.store.claim("r", "w1", 30.0)
    assert (lease.owner, lease.token, lease.ttl_seconds) == ("w1", 1, 30.0)
    # SQLite and memory use the local clock, PostgreSQL the server's (same host here).
    assert before + 29.0 < lease.expires_at < time.time() + 31.0


def test_claim_of_a_held_run_raises_lease_held_naming_owner_and_expiry(
    backend: Backend,
) -> None:
    start(backend.store, "r")
    lease = backend.store.claim("r", "w1", 30.0)
    with pytest.raises(LeaseHeld, match=r"owned by worker w1 until \d{4}-") as held:
        backend.store.claim("r", "w2", 30.0)
    assert held.value.owner == "w1"
    assert held.value.expires_at == pytest.approx(lease.expires_at, abs=0.01)
    # Nothing changed: the holder still renews and writes under its token.
    backend.store.renew("r", lease)
    backend.store.append([event("r", 1)], fencing_token=lease.token)
    assert len(backend.store.load_events("r")) == 2


def test_claim_by_the_owner_again_succeeds_with_a_new_token(backend: Backend) -> None:
    start(backend.store, "r")
    first = backend.store.claim("r", "w1", 30.0)
    again = backend.store.claim("r", "w1", 30.0)
    assert (again.owner, again.token) == ("w1", first.token + 1)


def test_claim_after_expiry_succeeds_and_fences_the_old_owner(backend: Backend) -> None:
    start(backend.store, "r")
    old = backend.store.claim("r", "w1", 0.2)
    time.sleep(0.3)
    new = backend.store.claim("r", "w2", 30.0)
    assert (new.owner, new.token) == ("w2", old.token + 1)
    with pytest.raises(StaleLeaseError):
        backend.store.renew("r", old)
    with pytest.raises(StaleLeaseError):
        backend.store.append([event("r", 1)], fencing_token=old.token)
    assert len(backend.store.load_events("r")) == 1


def test_a_take_over_from_a_gone_holder_lets_one_claimant_in(backend: Backend) -> None:
    # Two workers find the holder w1 gone and both take over from it: the first gets the
    # run, the second meets the first's live lease (it must not fence the winner out).
    start(backend.store, "r")
    gone = backend.store.claim("r", "w1", 30.0)
    won = backend.store.claim("r", "w2", 30.0, take_over="w1")
    assert (won.owner, won.token) == ("w2", gone.token + 1)
    with pytest.raises(LeaseHeld) as held:
        backend.store.claim("r", "w3", 30.0, take_over="w1")
    assert held.value.owner == "w2"
    backend.store.renew("r", won)  # still the current lease
    backend.store.append([event("r", 1)], fencing_token=won.token)


def test_take_over_claims_a_held_run_and_bumps_the_token(backend: Backend) -> None:
    start(backend.store, "r")
    old = backend.store.claim("r", "w1", 30.0)
    new = backend.store.claim("r", "w2", 30.0, take_over=True)
    assert (new.owner, new.token) == ("w2", old.token + 1)
    with pytest.raises(StaleLeaseError):
        backend.store.append([event("r", 1), event("r", 2)], fencing_token=old.token)
    assert len(backend.store.load_events("r")) == 1
    backend.store.append([event("r", 1)], fencing_token=new.token)
    assert len(backend.store.load_events("r")) == 2


def test_claim_of_a_missing_run_raises_run_not_found(backend: Backend) -> None:
    with pytest.raises(RunNotFound):
        backend.store.claim("nope", "w1", 30.0)


def test_renew_extends_the_expiry_of_the_current_lease(backend: Backend) -> None:
    start(backend.store, "r")
    lease = backend.store.claim("r", "w1", 1.0)
    time.sleep(0.5)
    renewed = backend.store.renew("r", lease)
    assert (renewed.owner, renewed.token) == (lease.owner, lease.token)
    assert renewed.expires_at > lease.expires_at
    time.sleep(0.7)  # past the first expiry (1.0 s), within the renewed one (1.5 s)
    with pytest.raises(LeaseHeld):
        backend.store.claim("r", "w2", 30.0)


def test_renew_many_renews_the_current_leases_in_one_call(backend: Backend) -> None:
    """The renewals of an event loop's runs, one statement (runtime/driving/leases.py):
    a superseded or released lease is left out, as ``renew`` would refuse it."""
    many = getattr(backend.store, "renew_many", None)
    if many is None:
        pytest.skip("this store renews one lease at a time")
    for run_id in ("a", "b", "c", "d"):
        start(backend.store, run_id)
    held = {run_id: backend.store.claim(run_id, "w1", 1.0) for run_id in ("a", "b", "c", "d")}
    backend.store.claim("b", "w2", 30.0, take_over=True)  # b: superseded
    backend.store.release("c", held["c"])  # c: released
    time.sleep(0.5)
    renewed = many(list(held.items()))
    assert sorted(renewed) == ["a", "d"]
    for run_id in ("a", "d"):
        lease = renewed[run_id]
        assert (lease.owner, lease.token) == (held[run_id].owner, held[run_id].token)
        assert lease.expires_at > held[run_id].expires_at
    time.sleep(0.7)  # past the first expiry, within the renewed one
    with pytest.raises(LeaseHeld):
        backend.store.claim("a", "w3", 30.0)


def test_release_frees_the_run_keeps_the_token_and_is_idempotent(backend: Backend) -> None:
    start(backend.store, "r")
    lease = backend.store.claim("r", "w1", 30.0)
    backend.store.release("r", lease)
    backend.store.release("r", lease)
    with pytest.raises(StaleLeaseError):
        backend.store.renew("r", lease)
    new = backend.store.claim("r", "w2", 30.0)
    assert new.token == lease.token + 1  # tokens never go down


def test_release_of_a_superseded_lease_changes_nothing(backend: Backend) -> None:
    start(backend.store, "r")
    old = backend.store.claim("r", "w1", 30.0)
    new = backend.store.claim("r", "w2", 30.0, take_over=True)
    backend.store.release("r", old)
    with pytest.raises(LeaseHeld, match="owned by worker w2"):
        backend.store.claim("r", "w3", 30.0)
    backend.store.renew("r", new)


def test_append_with_the_current_token_lands_with_its_status(backend: Backend) -> None:
    start(backend.store, "r")
    lease = backend.store.claim("r", "w1", 30.0)
    backend.store.append([event("r", 1)], (RunStatus.SUCCEEDED, None), fencing_token=lease.token)
    found = backend.store.get_run("r")
    assert found is not None
    assert found.status is RunStatus.SUCCEEDED


def test_a_run_created_under_a_lease_is_held_by_it_with_the_first_token(
    backend: Backend,
) -> None:
    first = event("r", 0, {"input": "r"})
    lease = Lease("w1", 1, time.time() + 30.0, 30.0)
    assert backend.store.create_run(row("r"), first, lease) is None
    with pytest.raises(LeaseHeld, match="owned by worker w1"):
        backend.store.claim("r", "w2", 30.0)
    backend.store.renew("r", lease)
    backend.store.append([event("r", 1)], fencing_token=1)
    # An existing run is not taken by another create under a lease.
    other = Lease("w2", 1, time.time() + 30.0, 30.0)
    assert backend.store.create_run(row("r"), first, other) is not None
    assert backend.store.claim("r", "w1", 30.0).token == 2


@pytest.mark.parametrize(
    ("status", "released"),
    [
        (RunStatus.SUCCEEDED, True),
        (RunStatus.FAILED, True),
        (RunStatus.CANCELLED, True),
        (RunStatus.NEEDS_REVIEW, False),
        (RunStatus.AWAITING_APPROVAL, False),
        (RunStatus.RUNNING, False),
    ],
)
def test_a_terminal_status_releases_the_lease_in_the_same_append(
    backend: Backend, status: RunStatus, released: bool
) -> None:
    start(backend.store, "r")
    lease = backend.store.claim("r", "w1", 30.0)
    backend.store.append([event("r", 1)], (status, None), fencing_token=lease.token)
    if released:  # as release would: free for anyone, the token kept
        assert backend.store.claim("r", "w2", 30.0).token == lease.token + 1
    else:
        with pytest.raises(LeaseHeld, match="owned by worker w1"):
            backend.store.claim("r", "w2", 30.0)


def test_append_with_a_stale_token_keeps_nothing_not_even_the_status(
    backend: Backend,
) -> None:
    start(backend.store, "r")
    old = backend.store.claim("r", "w1", 30.0)
    backend.store.claim("r", "w2", 30.0, take_over=True)
    with pytest.raises(StaleLeaseError):
        backend.store.append(
            [event("r", 1, BIG)], (RunStatus.SUCCEEDED, None), fencing_token=old.token
        )
    assert len(backend.store.load_events("r")) == 1
    found = backend.store.get_run("r")
    assert found is not None
    assert found.status is RunStatus.RUNNING
    assert backend.blob_count() == 0


def test_append_with_a_token_on_a_never_claimed_run(backend: Backend) -> None:
    start(backend.store, "r")
    with pytest.raises(StaleLeaseError):
        backend.store.append([event("r", 1)], fencing_token=1)
    backend.store.append([event("r", 1)], fencing_token=0)  # the initial token
    backend.store.append([event("r", 2)])  # unfenced writes are not checked
    assert len(backend.store.load_events("r")) == 3


def test_leases_of_runs_are_independent(backend: Backend) -> None:
    start(backend.store, "a")
    start(backend.store, "b")
    a = backend.store.claim("a", "w1", 30.0)
    b = backend.store.claim("b", "w2", 30.0)
    assert (a.token, b.token) == (1, 1)
    backend.store.append([event("b", 1)], fencing_token=b.token)
    with pytest.raises(LeaseHeld):
        backend.store.claim("a", "w2", 30.0)


# -- durability --------------------------------------------------------------


def test_durable_appends_and_syncs_keep_the_journal_as_plain_ones(backend: Backend) -> None:
    store = backend.store
    store.sync()  # nothing committed yet: nothing to do, no error
    first = start(store, "r1")
    second = event("r1", 1, {"big": BIG})
    store.append([second], durable=True)
    third = event("r1", 2, "after")
    store.append([third], (RunStatus.SUCCEEDED, None))
    store.sync()
    assert store.load_events("r1") == [first, second, third]
    found = store.get_run("r1")
    assert found is not None
    assert found.status is RunStatus.SUCCEEDED
    with pytest.raises(StaleLeaseError):  # a durable append is checked like any other
        store.append([event("r1", 2, "again")], durable=True)
    assert store.load_events("r1") == [first, second, third]


def test_concurrent_durable_appends_all_land(backend: Backend) -> None:
    """Runs of one process reaching output points together (a worker with concurrency N)
    share forced syncs; none of their records is lost or mixed up."""
    store = backend.store
    runs, per_run = 6, 5
    for n in range(runs):
        start(store, f"r{n}")
    gate = threading.Barrier(runs)
    failures: list[BaseException] = []

    def drive(run_id: str) -> None:
        try:
            gate.wait(timeout=30)
            for seq in range(1, per_run + 1):
                store.append([event(run_id, seq, seq)], durable=seq % 2 == 1)
        except BaseException as exc:  # reported below, with the run
            failures.append(exc)

    threads = [threading.Thread(target=drive, args=(f"r{n}",)) for n in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    for n in range(runs):
        assert [e.value for e in store.load_events(f"r{n}")[1:]] == list(range(1, per_run + 1))


# -- the ledger's clock (Store.now) --------------------------------------------


def test_the_ledger_clock_is_monotonic_and_not_behind_what_the_ledger_holds(
    backend: Backend,
) -> None:
    store = backend.store
    server = isinstance(store, (MemoryStore, SQLiteStore)) is False  # PostgreSQL
    real = time.time()
    store.clock.clock = lambda: real - 3600.0  # this host's clock runs an hour behind
    first = store.now()
    if server:  # the server's clock, whatever the host's says
        assert abs(first - real) < 60
    else:  # nothing recorded yet: the host's clock is all there is
        assert first < real - 3000
    # Another host (right clock) journals an act's intent: never behind it again.
    start(store, "r1", created_at=real)
    intent = Event("r1", 1, EventType.ACT_INTENT, "a", {"intent_digest": "d" * 64}, real)
    store.append([intent])
    later = store.now()
    assert later >= (first if server else real)
    readings = [store.now() for _ in range(5)]
    assert readings == sorted(readings)  # never backwards
