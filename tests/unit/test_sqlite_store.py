"""How the embedded SQLite ledger is opened: WAL, synchronous per durability, migrations."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.store.sql import load_migrations
from crashproof.store.sqlite import SCHEMA_VERSION, SQLiteStore

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _pragma(store: SQLiteStore, name: str) -> Any:
    # synchronous is a per-connection setting: only the store's own connection knows it.
    return store._conn.execute(f"PRAGMA {name}").fetchone()[0]


@pytest.mark.parametrize(
    ("durability", "expected"),
    [(None, "NORMAL"), ("output", "NORMAL"), ("full", "FULL"), ("normal", "NORMAL")],
)
def test_wal_and_synchronous_follow_durability(
    tmp_path: Path, durability: str | None, expected: str
) -> None:
    path = tmp_path / "ledger.db"
    kwargs: dict[str, Any] = {} if durability is None else {"durability": durability}
    with cp.Ledger(f"sqlite:///{path}", **kwargs) as ledger:
        store = ledger._store
        assert isinstance(store, SQLiteStore)
        assert SYNCHRONOUS[_pragma(store, "synchronous")] == expected
        assert _pragma(store, "journal_mode") == "wal"
        # WAL is a property of the file: a second connection sees it too.
        with contextlib.closing(sqlite3.connect(path)) as other:
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrations_record_the_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    assert store.schema_version() == SCHEMA_VERSION
    store.close()

    migrations = load_migrations("sqlite")
    assert [m.version for m in migrations] == list(range(1, SCHEMA_VERSION + 1))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        meta = dict(conn.execute("SELECT key, value FROM crashproof_meta").fetchall())
        applied = conn.execute(
            "SELECT version, name, applied_at FROM crashproof_migrations ORDER BY version"
        ).fetchall()
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert [(v, n) for v, n, _ in applied] == [(m.version, m.name) for m in migrations]
    assert applied[0][:2] == (1, "initial")
    assert all(isinstance(at, float) and at > 0 for _, _, at in applied)


def test_reopening_does_not_migrate_again(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    for _ in range(3):
        SQLiteStore(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        count = conn.execute("SELECT count(*) FROM crashproof_migrations").fetchone()[0]
    assert count == SCHEMA_VERSION


def test_the_schema_equals_all_migrations_applied(tmp_path: Path) -> None:
    # A new ledger gets schema.sql at once; an old one gets the migrations in order.
    SQLiteStore(tmp_path / "ledger.db").close()
    reference = tmp_path / "reference.db"
    with contextlib.closing(sqlite3.connect(reference)) as conn:
        for migration in load_migrations("sqlite"):
            conn.executescript(migration.sql)
    assert sqlite_schema(tmp_path / "ledger.db") == sqlite_schema(reference)


def sqlite_schema(path: Path) -> dict[str, object]:
    """The structure of every table and index in sqlite_master: columns (name, type, not
    null, default, primary key), STRICT / WITHOUT ROWID, foreign keys, indexes. (The sql
    text itself differs: ALTER TABLE appends columns to the stored CREATE statement.)"""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        objects = conn.execute(
            "SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        ).fetchall()
        out: dict[str, object] = {"objects": objects}
        for type_, name, table in objects:
            if type_ == "table":
                out[name] = (
                    conn.execute(f"PRAGMA table_xinfo({name})").fetchall(),
                    conn.execute(
                        "SELECT type, ncol, wr, strict FROM pragma_table_list WHERE name = ?",
                        (name,),
                    ).fetchall(),
                    conn.execute(f"PRAGMA foreign_key_list({name})").fetchall(),
                )
            else:
                unique = [r[2] for r in conn.execute(f"PRAGMA index_list({table})") if r[1] == name]
                out[name] = (table, conn.execute(f"PRAGMA index_info({name})").fetchall(), unique)
    return out


def test_an_empty_file_becomes_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        assert ledger.runs() == []
    store = SQLiteStore(path)
    assert store.schema_version() == SCHEMA_VERSION
    store.close()


def _opened_while_held(
    path: Path,
    holder: sqlite3.Connection,
    release: Callable[[sqlite3.Connection], None],
    count: int = 3,
) -> list[SQLiteStore]:
    """Stores opened by ``count`` threads at once while ``holder`` holds a lock on
    ``path``; once they wait for it (0.5 s), ``release(holder)`` ends its transaction.
    Raises what any of them raised."""
    opened: list[SQLiteStore] = []
    failures: list[BaseException] = []

    def open_store() -> None:
        try:
            opened.append(SQLiteStore(path))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(count)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # each has read the file and waits for the lock
    release(holder)
    holder.close()
    for thread in threads:
        thread.join()
    if failures:
        for store in opened:
            store.close()
        raise failures[0]
    return opened


def test_stores_that_find_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Stores (processes starting together) that all read the file as new, then create
    it one after the other: the later ones find it created and open it, instead of
    failing on tables that exist."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA journal_mode=WAL")  # an empty database, no table yet
    holder.execute("BEGIN IMMEDIATE")  # the stores read it as new, then wait to create it
    opened = _opened_while_held(path, holder, lambda held: held.execute("ROLLBACK"))
    try:
        assert [store.schema_version() for store in opened] == [SCHEMA_VERSION] * 3
    finally:
        for store in opened:
            store.close()


def test_a_ledger_created_at_an_older_schema_meanwhile_is_migrated_not_left(
    tmp_path: Path,
) -> None:
    """A store that read the file as new, while another process (an older crashproof)
    was creating it at schema 4, checks what it finds and migrates it to this version's
    schema, instead of using it as it was left."""
    golden = Path(__file__).resolve().parent.parent / "golden" / "schema4.db"
    with contextlib.closing(sqlite3.connect(golden)) as source:
        dump = [line for line in source.iterdump() if line not in ("BEGIN TRANSACTION;", "COMMIT;")]
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("BEGIN IMMEDIATE")

    def create_and_commit(held: sqlite3.Connection) -> None:
        for statement in dump:  # the older process creates its ledger, then commits
            held.execute(statement)
        held.execute("COMMIT")

    opened = _opened_while_held(path, holder, create_and_commit, count=1)
    try:
        assert opened[0].schema_version() == SCHEMA_VERSION > 4
        assert opened[0].list_runs()  # the older process's runs, kept
    finally:
        for store in opened:
            store.close()


def test_stores_wait_for_a_lock_held_on_a_new_file_not_yet_in_wal_mode(tmp_path: Path) -> None:
    """Switching a file to WAL mode is refused at once (no busy handler) while another
    connection holds a lock on it: the store waits for it, as for any other lock, and
    gives up with a clear error only after its busy timeout."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # a rollback-journal file, its write lock held
    with pytest.raises(cp.LedgerError, match="locked by another process"):
        SQLiteStore(path, busy_timeout=0.2)
    opened = _opened_while_held(path, holder, lambda held: held.execute("ROLLBACK"))
    try:
        assert [store.schema_version() for store in opened] == [SCHEMA_VERSION] * 3
    finally:
        for store in opened:
            store.close()


RUN_ROW = RunRow(
    run_id="r1",
    workflow="wf",
    version="1",
    status=RunStatus.RUNNING,
    input_digest="d" * 64,
    created_at=1.0,
    updated_at=1.0,
)


def test_two_writers_on_one_file_the_second_append_of_a_seq_loses(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    first, second = SQLiteStore(path), SQLiteStore(path)
    row = RUN_ROW
    try:

        def event(seq: int, value: str) -> Event:
            type_ = EventType.RUN_STARTED if seq == 0 else EventType.STEP_DONE
            return Event(
                run_id="r1",
                seq=seq,
                type=type_,
                key=None if seq == 0 else "s",
                payload={},
                value_json=f'"{value}"',
                created_at=1.0,
            )

        assert first.create_run(row, event(0, "start")) is None
        assert second.create_run(row, event(0, "other start")) == row
        first.append([event(1, "mine")])
        with pytest.raises(cp.StaleLeaseError):
            second.append([event(1, "theirs")], (RunStatus.SUCCEEDED, None))
        assert [e.value for e in second.load_events("r1")] == ["start", "mine"]
        assert second.get_run("r1") == row
    finally:
        first.close()
        second.close()


def _step_event(seq: int) -> Event:
    """Record ``seq`` of run r1: its start, then steps s1, s2, ..."""
    type_ = EventType.RUN_STARTED if seq == 0 else EventType.STEP_DONE
    key = None if seq == 0 else f"s{seq}"
    return Event(
        run_id="r1", seq=seq, type=type_, key=key, payload={}, value_json="1", created_at=1.0
    )


def test_a_store_that_knows_a_runs_end_still_sees_other_writers(tmp_path: Path) -> None:
    """The store keeps each run's journal end between its own appends (no journal-end
    query per step); a commit by another connection, or a claim, must still be seen."""
    path = tmp_path / "ledger.db"
    first, second = SQLiteStore(path), SQLiteStore(path)
    row, event = RUN_ROW, _step_event

    try:
        first.create_run(row, event(0))
        first.append([event(1)])
        first.append([event(2)])  # the end of r1 is now known to ``first``
        second.append([event(3)])  # ... and moved by another connection
        with pytest.raises(cp.StaleLeaseError, match="already taken or out of order"):
            first.append([event(3)])
        first.append([event(4)])
        lease = first.claim("r1", "w1", 30.0)
        first.append([event(5)], fencing_token=lease.token)
        taken = second.claim("r1", "w2", 30.0, take_over=True)  # fences ``first`` out
        with pytest.raises(cp.StaleLeaseError, match="taken over"):
            first.append([event(6)], fencing_token=lease.token)
        second.append([event(6)], fencing_token=taken.token)
        assert [e.key for e in first.load_events("r1")] == [None, *(f"s{i}" for i in range(1, 7))]
    finally:
        first.close()
        second.close()


def test_the_usual_append_is_one_statement_and_a_refused_one_keeps_nothing(
    tmp_path: Path,
) -> None:
    """One record right after the one this store wrote is one INSERT in autocommit mode
    that checks the run's last record and fencing token itself; anything else (another
    writer's record, a claim) takes the checked transaction and is refused as before."""
    path = tmp_path / "ledger.db"
    first, second = SQLiteStore(path), SQLiteStore(path)
    row, event = RUN_ROW, _step_event

    statements: list[str] = []

    def kinds() -> list[str]:  # each statement's first word, after its comment lines
        code = ("\n".join(x for x in s.splitlines() if not x.startswith("--")) for s in statements)
        return [c.split()[0] for c in code]

    try:
        first.create_run(row, event(0))
        first.append([event(1)])
        first._conn.set_trace_callback(statements.append)
        first.append([event(2)])
        assert kinds() == ["INSERT"]
        lease = first.claim("r1", "w1", 30.0)
        first.append([event(3)], fencing_token=lease.token)
        statements.clear()
        first.append([event(4)], fencing_token=lease.token)
        assert kinds() == ["INSERT"]
        second.claim("r1", "w2", 30.0, take_over=True)  # unknown to ``first``
        statements.clear()
        with pytest.raises(cp.StaleLeaseError, match="taken over"):
            first.append([event(5)], fencing_token=lease.token)
        assert kinds()[:2] == ["INSERT", "BEGIN"]  # refused by its own check, then the
        # checked path named the cause
        assert [e.seq for e in second.load_events("r1")] == [0, 1, 2, 3, 4]
    finally:
        first.close()
        second.close()


def test_other_runs_append_while_a_long_journal_loads(tmp_path: Path) -> None:
    """A journal is loaded (and its chain verified) on a connection of its own: a resume
    of a long run does not hold up the appends of the runs beside it. (Loaded under the
    store's lock, every append waited for the whole load.)"""
    from crashproof.integrity.keys import Keyring
    from crashproof.integrity.seal import Sealer

    store = SQLiteStore(tmp_path / "ledger.db", sealer=Sealer(Keyring(b"k" * 32)))
    try:
        store.create_run(RUN_ROW, _step_event(0))
        for start in range(1, 30_001, 1_000):
            store.append([_step_event(seq) for seq in range(start, start + 1_000)])

        def other(seq: int) -> Event:
            type_ = EventType.RUN_STARTED if seq == 0 else EventType.STEP_DONE
            return Event("r2", seq, type_, None if seq == 0 else f"s{seq}", {}, 1.0, "1")

        store.create_run(dataclasses.replace(RUN_ROW, run_id="r2"), other(0))
        loading = threading.Event()
        loaded: list[float] = []

        def load() -> None:
            loading.set()
            events = store.load_events("r1")
            loaded.append(time.perf_counter())
            if len(events) != 30_001:
                loaded.append(-1.0)

        loader = threading.Thread(target=load)
        loader.start()
        loading.wait()
        done: list[float] = []
        seq = 1
        while loader.is_alive():
            store.append([other(seq)])
            done.append(time.perf_counter())
            seq += 1
        loader.join()
        assert len(loaded) == 1  # the whole journal, verified
        during = [t for t in done if t < loaded[0]]
        assert len(during) >= 10, f"only {len(during)} appends finished during the load"
        assert [e.seq for e in store.load_events("r2")] == list(range(seq))
    finally:
        store.close()
