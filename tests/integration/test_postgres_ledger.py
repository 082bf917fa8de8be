"""The PostgreSQL ledger end to end, on a server the tests start themselves.

A workflow with steps, decisions and a workspace act is crashed at every crash point
(in-process) and at a few with SIGKILL (a real child process), then resumed by a new
Ledger object: same result, no body re-run but the one whose commit the crash lost, the
file edited once. Then what must be refused, with nothing written: an unreachable server,
a wrong password, a ledger of a newer crashproof, a schema that holds another app's tables.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import Event, EventType, RunRow, RunStatus
from crashproof.store.port import BLOB_THRESHOLD
from crashproof.store.postgres import SCHEMA_VERSION, PostgresStore

sys.path.insert(0, str(Path(__file__).parent))
import postgres_child

CHILD = Path(__file__).parent / "postgres_child.py"
BODIES = ("fetch", "plan", "apply", "review")  # the local bodies; the act is counted apart
LINE = "+edit a.py\n"


def _reference() -> tuple[Any, list[str]]:
    """The uninterrupted run (on the memory store): its result and every crash point."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        points = cp.CrashPoints()
        ledger = cp.Ledger("memory://", crash_points=points)
        workflow = postgres_child.make(root / "counts", cp.Workspace(root / "ws"))
        return ledger.run(workflow, run_id="r", repo="x"), points.passed


REFERENCE, POINTS = _reference()


def counts(path: Path) -> Counter[str]:
    return Counter(path.read_text().split()) if path.exists() else Counter()


def check_resumed(url: str, tmp_path: Path, cut_off: str | None) -> None:
    """Resume with a new Ledger object; check the outcome against the reference."""
    before = counts(tmp_path / "counts")
    workflow = postgres_child.make(tmp_path / "counts", cp.Workspace(tmp_path / "ws"))
    with cp.Ledger(url) as resumed:
        assert resumed.run(workflow, run_id="r", repo="x") == REFERENCE
        info = resumed.get_run("r")
    assert info.status is cp.RunStatus.SUCCEEDED
    assert [s.key for s in info.steps] == ["fetch", "plan", "write", "apply", "review"]
    assert info.budget == cp.Budget(steps=5, decisions=2, tokens=12, cost=0.1 + 0.2)
    assert (tmp_path / "ws" / "notes.txt").read_text() == LINE  # the act applied once
    calls = counts(tmp_path / "counts")
    # Only the body whose commit the crash cut off runs twice; no decision committed
    # before the crash is asked again.
    assert dict(calls) == {body: 2 if body == cut_off else 1 for body in BODIES}
    for decision in ("plan", "review"):
        if before[decision] == 1 and decision != cut_off:
            assert calls[decision] == 1, f"decision {decision!r} was asked again"


def cut_off_by(point: str) -> str | None:
    body = point.removeprefix("before_commit[step_done:").removesuffix("]")
    return body if body in BODIES else None


def test_the_workflow_passes_every_kind_of_crash_point() -> None:
    assert len(POINTS) == 2 + 2 * len(BODIES) + 6 + 2
    assert "inside[act:write:written]" in POINTS


@pytest.mark.parametrize("n", range(1, len(POINTS) + 1), ids=POINTS)
def test_crash_at_every_point_then_resume(n: int, pg_url: str, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    workflow = postgres_child.make(tmp_path / "counts", cp.Workspace(tmp_path / "ws"))
    crashing = cp.Ledger(pg_url, crash_points=cp.CrashPoints(at=n))
    with crashing, pytest.raises(cp.SimulatedCrash) as crash:
        crashing.run(workflow, run_id="r", repo="x")
    assert crash.value.point == POINTS[n - 1]
    check_resumed(pg_url, tmp_path, cut_off_by(POINTS[n - 1]))


@pytest.mark.parametrize(
    "point",
    [
        "after_commit[run_started]",
        "before_commit[step_done:plan]",
        "inside[act:write:written]",
        "before_commit[run_succeeded]",
    ],
)
def test_sigkill_then_resume(point: str, pg_url: str, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    child = subprocess.run(
        [sys.executable, str(CHILD), pg_url, str(tmp_path / "counts"), str(tmp_path / "ws"), point],
        check=False,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL
    check_resumed(pg_url, tmp_path, cut_off_by(point))


# -- what must be refused, with nothing written ---------------------------------------


@cp.workflow("hello")
def hello(ctx: cp.Context) -> str:
    return ctx.step("greet", lambda: "hi")


def snapshot(server: Any, url: str) -> list[tuple[object, ...]]:
    """Every table outside the system schemas, with its rows."""
    tables = server.query(
        url,
        "SELECT n.nspname, c.relname FROM pg_class AS c "
        "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.relkind = 'r' "
        "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1, 2",
    )
    schemas = server.query(url, "SELECT nspname FROM pg_namespace ORDER BY 1")
    rows = [
        (schema, table, sorted(map(repr, server.query(url, f'SELECT * FROM "{schema}"."{table}"'))))
        for schema, table in tables
    ]
    return [*schemas, *rows]


def check_no_driver_traceback(error: BaseException) -> None:
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


def test_an_unreachable_server_is_a_clear_ledger_error() -> None:
    from postgres_server import free_port

    url = f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/ledger"
    with pytest.raises(cp.LedgerError) as caught:
        cp.Ledger(url)
    message = str(caught.value)
    assert "unreachable" in message
    assert "127.0.0.1" in message
    assert "s3cret" not in message  # the password is never echoed
    check_no_driver_traceback(caught.value)


def test_a_wrong_password_is_a_clear_ledger_error(pg_server: Any, pg_url: str) -> None:
    before = snapshot(pg_server, pg_url)
    url = pg_url.replace("postgres:crashproof-test-pw@", "postgres:wrong-pw@")
    with pytest.raises(cp.LedgerError, match="password authentication failed") as caught:
        cp.Ledger(url)
    assert "wrong-pw" not in str(caught.value)
    check_no_driver_traceback(caught.value)
    assert snapshot(pg_server, pg_url) == before


def test_a_missing_database_is_a_clear_ledger_error(pg_server: Any) -> None:
    with pytest.raises(cp.LedgerError, match='database "no_such_db" does not exist'):
        cp.Ledger(pg_server.url("no_such_db"))


@pytest.mark.parametrize("encoding", ["LATIN1", "SQL_ASCII"])
def test_a_new_ledger_in_a_database_not_in_utf8_is_refused(pg_server: Any, encoding: str) -> None:
    # A ledger keeps whatever text its runs meet: in LATIN1 a model's reply in Japanese
    # was refused at every resume; in SQL_ASCII no run could even start (psycopg read
    # bytes back). Refused at creation, with what to do; nothing is written.
    name = f"encoded_{encoding.lower()}"
    pg_server.admin().execute(
        f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' "
        "TEMPLATE template0"
    )
    url = pg_server.url(name)
    with pytest.raises(
        cp.LedgerError, match=f"encoding is {encoding}, .* ENCODING 'UTF8'"
    ) as caught:
        cp.Ledger(url)
    check_no_driver_traceback(caught.value)
    assert (
        pg_server.query(url, "SELECT nspname FROM pg_namespace WHERE nspname = 'crashproof'") == []
    )


@cp.workflow("echo")
def echo(ctx: cp.Context, text: str) -> str:
    return ctx.step("say", lambda: text)


def test_texts_travel_as_utf8_whatever_the_client_encoding_says(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libpq's client encoding comes from PGCLIENTENCODING where set: in LATIN1 psycopg
    # could not send a step's value in Japanese (every resume met the same refusal).
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    with cp.Ledger(pg_url) as ledger:
        assert ledger.run(echo, run_id="挨拶", text="こんにちは") == "こんにちは"
        assert ledger.journal("挨拶")[1].value_json == '"こんにちは"'


def test_a_ledger_of_a_newer_crashproof_is_refused(pg_server: Any, pg_url: str) -> None:
    with cp.Ledger(pg_url) as ledger:
        ledger.run(hello, run_id="r")
    pg_server.query(
        pg_url, "UPDATE crashproof.crashproof_meta SET value = '99' WHERE key = 'schema_version'"
    )
    before = snapshot(pg_server, pg_url)
    with pytest.raises(cp.SchemaTooNew) as caught:
        cp.Ledger(pg_url)
    assert (caught.value.found, caught.value.supported) == (99, SCHEMA_VERSION)
    assert "99" in str(caught.value)
    assert f"up to {SCHEMA_VERSION}" in str(caught.value)
    assert snapshot(pg_server, pg_url) == before


def test_another_apps_tables_in_the_schema_are_refused(pg_server: Any, pg_url: str) -> None:
    pg_server.query(
        pg_url,
        "CREATE SCHEMA crashproof; CREATE TABLE crashproof.orders (id int, item text); "
        "INSERT INTO crashproof.orders VALUES (1, 'book')",
    )
    before = snapshot(pg_server, pg_url)
    with pytest.raises(cp.NotALedger, match="orders") as caught:
        cp.Ledger(pg_url)
    check_no_driver_traceback(caught.value)
    assert snapshot(pg_server, pg_url) == before


def test_an_app_in_the_same_database_is_left_alone(pg_server: Any, pg_url: str) -> None:
    pg_server.query(pg_url, "CREATE TABLE public.runs (id int); INSERT INTO public.runs VALUES (7)")
    for url in (pg_url, pg_url + "?schema=second"):
        with cp.Ledger(url) as ledger:
            assert ledger.run(hello, run_id="r") == "hi"
    assert pg_server.query(pg_url, "SELECT * FROM public.runs") == [(7,)]
    assert pg_server.query(pg_url, "SELECT count(*) FROM crashproof.runs") == [(1,)]
    assert pg_server.query(pg_url, "SELECT count(*) FROM second.runs") == [(1,)]


# -- concurrency ------------------------------------------------------------------------


def test_processes_opening_a_new_ledger_at_once_migrate_it_once(
    pg_server: Any, pg_url: str
) -> None:
    barrier, errors, stores = threading.Barrier(4), [], []

    def open_one() -> None:
        barrier.wait()
        try:
            stores.append(PostgresStore(pg_url))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [s.schema_version() for s in stores] == [SCHEMA_VERSION] * 4
    for store in stores:
        store.close()
    migrations = pg_server.query(pg_url, "SELECT version FROM crashproof.crashproof_migrations")
    assert migrations == [(v,) for v in range(1, SCHEMA_VERSION + 1)]  # each applied once


def test_two_writers_racing_for_one_seq_one_wins(pg_url: str) -> None:
    def event(seq: int, who: str) -> Event:
        type_ = EventType.RUN_STARTED if seq == 0 else EventType.STEP_DONE
        return Event(
            run_id="r", seq=seq, type=type_, key=who, payload={}, value_json='"x"', created_at=1.0
        )

    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    row = RunRow(
        run_id="r",
        workflow="wf",
        version="1",
        status=RunStatus.RUNNING,
        input_digest="d",
        created_at=1.0,
        updated_at=1.0,
    )
    a.create_run(row, event(0, "a"))

    def write(
        store: PostgresStore, who: str, seq: int, barrier: threading.Barrier, outcomes: list[str]
    ) -> None:
        barrier.wait()
        try:
            store.append([event(seq, who)])
            outcomes.append(who)
        except cp.StaleLeaseError:
            outcomes.append("stale")

    for seq in range(1, 11):
        barrier, outcomes = threading.Barrier(2), list[str]()
        threads = [
            threading.Thread(target=write, args=(store, who, seq, barrier, outcomes))
            for store, who in ((a, "a"), (b, "b"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) in (["a", "stale"], ["b", "stale"])  # exactly one won
    journal = a.load_events("r")
    assert [e.seq for e in journal] == list(range(11))
    a.close()
    b.close()


def test_connections_the_server_dropped_are_replaced(pg_server: Any, pg_url: str) -> None:
    with cp.Ledger(pg_url) as ledger:
        assert ledger.run(hello, run_id="r1") == "hi"
        killed = pg_server.query(
            pg_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert killed  # the ledger's pooled connection(s), cut by the server
        # pg_terminate_backend only signals: wait until the backends are gone (as after a
        # server restart), so their FATAL message has reached the pooled sockets.
        others = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        deadline = time.monotonic() + 10
        while pg_server.query(pg_url, others)[0][0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ledger.run(hello, run_id="r2") == "hi"
        assert [r.run_id for r in ledger.runs()] == ["r1", "r2"]


def test_a_process_holding_over_1024_files_still_gets_connections(pg_url: str) -> None:
    """The pool's checkout check polls the connection's socket: select() refused one
    numbered 1024 or more, and the pool, taking that for a broken connection, never
    handed one out (a long test session, or an app holding many files, hit it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may hold {hard} files only")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with cp.Ledger(pg_url) as ledger:  # its connections are numbered past 1100
            assert ledger.run(hello, run_id="r1") == "hi"
            assert ledger.run(hello, run_id="r2") == "hi"  # a checkout of a pooled one
            assert [r.run_id for r in ledger.runs()] == ["r1", "r2"]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    ("durability", "setting", "durable"),
    [("output", "off", "on"), ("full", "on", "on"), ("normal", "off", "off")],
)
def test_durability_sets_synchronous_commit_per_transaction(
    pg_url: str, durability: str, setting: str, durable: str
) -> None:
    store = PostgresStore(pg_url, durability=durability)
    try:
        with store._transaction() as cur:
            assert cur.execute("SHOW synchronous_commit").fetchone() == (setting,)
        # A commit right before an output (append(durable=True), sync()) waits for the disk.
        with store._transaction(durable=True) as cur:
            assert cur.execute("SHOW synchronous_commit").fetchone() == (durable,)
        store.sync()
    finally:
        store.close()


def test_import_crashproof_does_not_import_psycopg() -> None:
    code = "import sys, crashproof; sys.exit('psycopg' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_sealed_journal_round_trips_and_shows_tampering(pg_server: Any, pg_url: str) -> None:
    from crashproof.integrity.keys import Keyring
    from crashproof.integrity.seal import Sealer

    def event(seq: int, value: str) -> Event:
        type_ = EventType.RUN_STARTED if seq == 0 else EventType.STEP_DONE
        payload = {"n": seq, "ü": "🙂"}
        return Event(
            run_id="r", seq=seq, type=type_, key=f"s{seq}", payload=payload, value_json=value,
            created_at=1.5 + seq,
        )  # fmt: skip

    row = RunRow(
        run_id="r",
        workflow="wf",
        version="1",
        status=RunStatus.RUNNING,
        input_digest="d",
        created_at=1.0,
        updated_at=1.0,
    )
    events = [event(0, '"small"'), event(1, '"' + "x" * BLOB_THRESHOLD + '"'), event(2, "[1,2]")]
    store = PostgresStore(pg_url, sealer=Sealer(Keyring(b"k" * 32)))
    try:
        store.create_run(row, events[0])
        store.append(events[1:])
        assert store.load_events("r") == events
        macs = pg_server.query(pg_url, "SELECT count(mac) FROM crashproof.events")
        assert macs == [(3,)]
        pg_server.query(pg_url, "UPDATE crashproof.blobs SET data = '\"forged\"'")
        with pytest.raises(cp.IntegrityError):
            store.load_events("r")
    finally:
        store.close()


def test_errors_never_show_the_password(pg_url: str) -> None:
    ledger = cp.Ledger(pg_url, key="ab" * 32)
    with pytest.raises(cp.RunNotFound) as caught:
        ledger.get_run("nope")
    ledger.close()
    password = pg_url.split("://", 1)[1].split("@", 1)[0].partition(":")[2]
    assert password
    assert password not in str(caught.value)
    assert ":***@" in str(caught.value)
