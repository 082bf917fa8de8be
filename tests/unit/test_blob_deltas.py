"""Large values stored as text deltas (schema 7, store/deltas.py): a step returning a
growing history stores each turn once, reads back exactly, and a ledger edited under
a delta is refused. Through real SQLite files and the Ledger."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.errors import IntegrityError
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.store import deltas
from crashproof.store.migrate import open_for_migration, plan_migration
from crashproof.store.port import BLOB_THRESHOLD
from crashproof.store.sqlite import SCHEMA_VERSION, SQLiteStore

GOLDEN = Path(__file__).parents[1] / "golden"
NEW = 2000  # characters of content per turn


def message(t: int) -> dict[str, str]:
    return {"role": "user", "content": f"turn {t}: " + "x" * NEW}


def history(turns: int) -> list[dict[str, str]]:
    return [message(t) for t in range(turns)]


@cp.workflow("delta-grow", version="1")
def grow(ctx: cp.Context, turns: int) -> int:
    """A step that returns the whole history each turn (what deltas are for)."""
    kept: list[dict[str, str]] = []
    for t in range(turns):
        kept = ctx.step(f"turn{t}", lambda h=kept, t=t: [*h, message(t)])
    return len(kept)


def rows(path: Path, sql: str, *args: Any) -> list[Any]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, args).fetchall()


def edit(path: Path, sql: str, *args: Any) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(sql, args)
        conn.commit()


def results(store: Any, run_id: str) -> dict[str, Any]:
    return {e.key: e.value for e in store.load_events(run_id) if e.type is EventType.STEP_DONE}


def orphans(path: Path) -> int:
    """Delta rows whose base row is missing (must never be written)."""
    return int(
        rows(
            path,
            "SELECT count(*) FROM blobs AS b WHERE b.base IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM blobs AS a WHERE a.digest = b.base)",
        )[0][0]
    )


def test_300_turns_of_a_growing_history_store_less_than_3x_the_new_bytes(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    turns = 300
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        assert ledger.run(grow, run_id="r", turns=turns) == turns
    new = sum(len(json.dumps(message(t), separators=(",", ":"))) + 1 for t in range(turns))
    edit(path, "PRAGMA wal_checkpoint(TRUNCATE)")
    on_disk = path.stat().st_size
    assert on_disk < 3 * new, (on_disk, new)  # stored whole: ~90 MB
    (stored, whole) = rows(path, "SELECT sum(length(data)), sum(base IS NULL) FROM blobs")[0]
    assert stored < 1.05 * new
    assert whole == 1  # the first large value; every later one extends the one before
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        found = results(ledger.store, "r")
        assert found[f"turn{turns - 1}"] == history(turns)
        assert found["turn150"] == history(151)
        ledger.register(grow)
        assert ledger.resume("r") == turns
    assert main(["check", "--db", f"sqlite:///{path}"]) == 0


def test_a_crashed_run_resumes_and_keeps_storing_deltas(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    url = f"sqlite:///{path}"
    crash = cp.CrashPoints(match="after_commit[step_done:turn12]")
    with cp.Ledger(url, crash_points=crash) as ledger, pytest.raises(cp.SimulatedCrash):
        ledger.run(grow, run_id="r", turns=20)
    with cp.Ledger(url) as ledger:
        ledger.register(grow)
        assert ledger.resume("r") == 20
        assert results(ledger.store, "r")["turn19"] == history(20)
    # The resumed process had no memo: its first large value is whole, then deltas again.
    assert rows(path, "SELECT sum(base IS NULL), sum(base IS NOT NULL) FROM blobs") == [(2, 14)]
    assert orphans(path) == 0


def _delta_row(path: Path) -> tuple[str, str, int]:
    """(digest, base, prefix) of a delta row whose base is a delta too."""
    found = rows(
        path,
        "SELECT b.digest, b.base, b.prefix FROM blobs AS b JOIN blobs AS a "
        "ON a.digest = b.base WHERE a.base IS NOT NULL ORDER BY length(b.data) LIMIT 1",
    )
    return found[0]  # type: ignore[no-any-return]


@pytest.fixture
def grown(tmp_path: Path) -> Path:
    path = tmp_path / "l.db"
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.run(grow, run_id="r", turns=12)
    return path


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ("UPDATE blobs SET data = replace(data, 'turn 3', 'turn 9') WHERE base IS NULL", "mac"),
        ("UPDATE blobs SET data = data || ' ' WHERE digest = :base", "mac"),
        ("UPDATE blobs SET prefix = prefix - 1 WHERE digest = :digest", "mac"),
        (
            "UPDATE blobs SET base = (SELECT base FROM blobs WHERE digest = :base) "
            "WHERE digest = :digest",
            "takes",
        ),
        ("UPDATE blobs SET prefix = 10000000 WHERE digest = :digest", "takes 10000000"),
        ("DELETE FROM blobs WHERE digest = :base", "is missing"),
        ("UPDATE blobs SET base = :digest WHERE digest = :digest", "circular"),
    ],
    ids=["base-text", "base-tail", "prefix", "base-swapped", "prefix-past", "no-base", "cycle"],
)
def test_an_edited_delta_or_base_is_refused(grown: Path, tamper: str, why: str) -> None:
    digest, base, _prefix = _delta_row(grown)
    edit(grown, tamper.replace(":digest", f"'{digest}'").replace(":base", f"'{base}'"))
    with cp.Ledger(f"sqlite:///{grown}") as ledger:
        match = "tampered|MAC|does not verify" if why == "mac" else why
        with pytest.raises(IntegrityError, match=match):
            ledger.store.load_events("r")
        ledger.register(grow)
        with pytest.raises(IntegrityError):
            ledger.resume("r")
    assert main(["check", "--db", f"sqlite:///{grown}"]) != 0


def test_an_unsealed_store_checks_the_digest_of_a_resolved_text(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = SQLiteStore(path)  # no sealer: no MAC to catch an edit
    try:
        _write(store, "r", [history(n) for n in range(5, 12)])
    finally:
        store.close()
    _digest, base, _prefix = _delta_row(path)
    edit(path, "UPDATE blobs SET data = data || ' ' WHERE digest = ?", base)
    store = SQLiteStore(path)
    try:
        with pytest.raises(IntegrityError, match="does not have its digest"):
            store.load_events("r")
    finally:
        store.close()


def _write(store: SQLiteStore, run_id: str, values: list[Any]) -> list[Event]:
    first = Event(run_id, 0, EventType.RUN_STARTED, None, {"input": run_id}, 1000.0)
    row = RunRow(
        run_id=run_id,
        workflow="wf",
        version="1",
        status=RunStatus.RUNNING,
        input_digest="d" * 64,
        created_at=1000.0,
        updated_at=1000.0,
    )
    store.create_run(row, first)
    written = [first]
    for seq, value in enumerate(values, 1):
        event = Event(
            run_id,
            seq,
            EventType.STEP_DONE,
            f"s{seq}",
            {"kind": "step", "status": "succeeded"},
            1000.0 + seq,
            value_json=json.dumps(value, separators=(",", ":")),
        )
        store.append([event])
        written.append(event)
    return written


def test_a_rolled_back_write_leaves_no_memo_naming_its_blob(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = SQLiteStore(path)
    try:
        written = _write(store, "r", [history(6)])
        undone = Event(
            "r",
            2,
            EventType.STEP_DONE,
            "s2",
            {"kind": "step"},
            1002.0,
            value_json=json.dumps(history(7), separators=(",", ":")),
        )
        with pytest.raises(AttributeError):  # fails after its blob row was inserted
            store.append([undone], ("not a status", None))  # type: ignore[arg-type]
        later = Event(
            "r",
            2,
            EventType.STEP_DONE,
            "s2",
            {"kind": "step"},
            1002.0,
            value_json=json.dumps(history(8), separators=(",", ":")),
        )
        store.append([later])
        assert store.load_events("r") == [*written, later]
    finally:
        store.close()
    assert orphans(path) == 0
    assert rows(path, "SELECT count(*) FROM blobs") == [(2,)]  # history(7) was undone


def test_chains_are_capped_and_resolved_without_recursion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deltas, "MAX_LINKS", 3)
    path = tmp_path / "l.db"
    values = [history(n) for n in range(5, 25)]
    store = SQLiteStore(path)
    try:
        _write(store, "r", values)
    finally:
        store.close()
    depth = rows(
        path,
        "WITH RECURSIVE up(d, n) AS (SELECT digest, 0 FROM blobs UNION ALL "
        "SELECT b.base, up.n + 1 FROM up JOIN blobs AS b ON b.digest = up.d "
        "WHERE b.base IS NOT NULL) SELECT max(n) FROM up",
    )
    assert depth == [(3,)]
    monkeypatch.setattr(deltas, "MAX_LINKS", 4096)
    store = SQLiteStore(path)
    try:
        assert [e.value for e in store.load_events("r")[1:]] == values
    finally:
        store.close()


def test_a_shared_value_read_cold_walks_its_chain(tmp_path: Path) -> None:
    # Run b's last value was stored first by run a, as a delta of a's chain: loading b
    # alone resolves it from a's rows (no memo holds its bases).
    path = tmp_path / "l.db"
    store = SQLiteStore(path)
    try:
        _write(store, "a", [history(n) for n in range(5, 15)])
        _write(store, "b", [{"other": "y" * BLOB_THRESHOLD}, history(14)])
    finally:
        store.close()
    store = SQLiteStore(path)
    try:
        assert store.load_events("b")[-1].value == history(14)
    finally:
        store.close()


def test_fork_export_and_import_round_trip(tmp_path: Path) -> None:
    source = tmp_path / "a.db"
    with cp.Ledger(f"sqlite:///{source}") as ledger:
        ledger.run(grow, run_id="r", turns=15)
        ledger.fork("r", from_step="turn9", new_run_id="f", by="test")
        ledger.register(grow)
        assert ledger.resume("f") == 15
        assert results(ledger.store, "f") == results(ledger.store, "r")
        document = ledger.export_run("r", copy=True)
    assert document["records"]  # full values travel, whatever the store kept
    target = tmp_path / "b.db"
    with cp.Ledger(f"sqlite:///{target}") as ledger:
        assert ledger.import_run(document, by="test") == "r"
        assert results(ledger.store, "r")["turn14"] == history(15)
    assert rows(target, "SELECT sum(base IS NULL), sum(base IS NOT NULL) FROM blobs") == [(1, 10)]
    assert orphans(source) == orphans(target) == 0
    assert main(["check", "--db", f"sqlite:///{target}"]) == 0


def test_a_schema_6_ledger_migrates_on_open_and_then_stores_deltas(tmp_path: Path) -> None:
    for found in GOLDEN.glob("transcript1.db*"):  # the golden ledger at schema 6
        shutil.copy(found, tmp_path / found.name)
    path = tmp_path / "transcript1.db"
    assert rows(path, "SELECT value FROM crashproof_meta WHERE key = 'schema_version'") == [("6",)]
    conn, current = open_for_migration(path)
    with contextlib.closing(conn):
        plan = plan_migration(conn, current, str(path))
    assert plan.additive
    assert "  new column blobs.base TEXT: 0 existing row(s) get NULL" in plan.changes
    assert "  new column blobs.prefix INTEGER: 0 existing row(s) get NULL" in plan.changes
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        assert ledger.run(grow, run_id="new", turns=8) == 8
        assert results(ledger.store, "new")["turn7"] == history(8)
    assert rows(path, "SELECT max(version) FROM crashproof_migrations") == [(SCHEMA_VERSION,)]
    assert rows(path, "SELECT count(*) FROM blobs WHERE base IS NOT NULL") == [(3,)]
    assert main(["check", "--db", f"sqlite:///{path}"]) == 0


def test_common_prefix_of_a_list_that_grew_and_of_an_edit() -> None:
    old = json.dumps(history(3), separators=(",", ":"))
    new = json.dumps(history(4), separators=(",", ":"))
    assert deltas.common_prefix(old, new) == len(old) - 1
    edited = old[:5000] + "Y" + old[5001:]
    assert deltas.common_prefix(old, edited) == 5000
    assert deltas.common_prefix(old, old[:4096]) == 4096
    assert deltas.common_prefix("", old) == 0


def test_the_writer_memo_is_bounded_and_forgets_ended_runs(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    try:
        for n in range(70):
            _write(store, f"r{n}", [[*history(5)[:-1], message(n)]])
        remembered = store._deltas._last  # one text per run: a bound on memory
        assert len(remembered) == 64
        assert "r69" in remembered
        assert "r0" not in remembered
        end = Event("r69", 2, EventType.RUN_SUCCEEDED, None, {"result": None}, 1003.0)
        store.append([end], (RunStatus.SUCCEEDED, None))
        assert "r69" not in store._deltas._last
    finally:
        store.close()


def test_a_batch_with_a_refused_record_keeps_no_delta_of_it(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = SQLiteStore(path)

    def step(run_id: str, seq: int, turns: int) -> Event:
        value = json.dumps(history(turns), separators=(",", ":"))
        return Event(run_id, seq, EventType.STEP_DONE, f"s{seq}", {}, 1000.0, value_json=value)

    try:
        # b's values equal a's: stored once, by whichever wrote them first.
        a = _write(store, "a", [history(5)])
        _write(store, "b", [history(5)])
        kept, refused = step("a", 2, 6), step("a", 9, 7)  # a gap: refused
        results = store.append_batch(
            [
                [([kept], None, None, False), ([refused], None, None, False)],
                [([step("b", 2, 6)], None, None, False)],
            ]
        )
        assert results[0] is not None
        assert results[0][0] == 1
        assert results[1] is None
        later = step("a", 3, 8)
        store.append([later])
        assert store.load_events("a") == [*a, kept, later]
        assert [e.value for e in store.load_events("b")[1:]] == [history(5), history(6)]
    finally:
        store.close()
    assert orphans(path) == 0
    # history(5) whole, 6 its delta; the refused record made the store forget a's last
    # value (whatever it had written of it was undone), so 8 is whole again.
    assert rows(path, "SELECT sum(base IS NULL), sum(base IS NOT NULL) FROM blobs") == [(2, 1)]
