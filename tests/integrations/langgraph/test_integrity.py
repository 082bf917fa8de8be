"""CrashproofSaver fails closed: an edited or spliced row, a rolled-back database, a wrong
key, a deleted latest checkpoint are refused before anything is parsed; a second
writer is refused (LeaseHeld) or fenced out (StaleLeaseError); a value JSON cannot hold
writes nothing; a growing transcript is stored as its new items."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint

import crashproof as cp
from crashproof.integrations.langgraph import CrashproofSaver

THREAD = "t1"


def _config(checkpoint_id: str | None = None, thread: str = THREAD) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _put(saver: CrashproofSaver, values: dict[str, Any], parent: Any = None, **kw: Any) -> Any:
    checkpoint = empty_checkpoint()
    versions = {k: saver.get_next_version(None, None) for k in values}
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = versions
    config = parent or _config(thread=kw.get("thread", THREAD))
    return saver.put(config, checkpoint, {"source": "loop", "step": 0}, versions)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def _sql(url: str, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(url[len("sqlite:///") :])
    with conn:
        conn.execute(sql, args)
    conn.close()


def test_an_edited_blob_is_refused_before_it_is_parsed(url: str) -> None:
    with CrashproofSaver(url) as saver:
        stored = _put(saver, {"messages": ["hello"]})
    _sql(url, "UPDATE langgraph_blobs SET value = '{not json'")
    with CrashproofSaver(url) as saver, pytest.raises(cp.JournalTampered, match="altered"):
        saver.get_tuple(stored)  # not a JSONDecodeError: the seal is checked first


def test_edited_metadata_is_refused(url: str) -> None:
    with CrashproofSaver(url) as saver:
        _put(saver, {"x": 1})
    _sql(url, "UPDATE langgraph_checkpoints SET metadata = '{\"step\":9}'")
    with CrashproofSaver(url) as saver, pytest.raises(cp.JournalTampered, match="checkpoint"):
        list(saver.list(_config()))


def test_a_row_spliced_from_another_thread_is_refused(url: str) -> None:
    with CrashproofSaver(url) as saver:
        _put(saver, {"x": 1})
        _put(saver, {"x": 2}, thread="t2")
    # t2's blob, value and seal, copied into t1's row: the seal binds thread and version
    _sql(
        url,
        "UPDATE langgraph_blobs SET (value, seal) = (SELECT value, seal FROM langgraph_blobs "
        "WHERE thread_id = 't2') WHERE thread_id = 't1'",
    )
    with CrashproofSaver(url) as saver, pytest.raises(cp.JournalTampered, match="channel 'x'"):
        saver.get_tuple(_config())


def test_a_rolled_back_database_is_refused(url: str, tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    backup = tmp_path / "backup.db"
    with CrashproofSaver(url) as saver:
        _put(saver, {"x": 1})
        source, copy = sqlite3.connect(db), sqlite3.connect(backup)
        source.backup(copy)
        source.close(), copy.close()
        _put(saver, {"x": 2})
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    backup.replace(db)  # an older, perfectly authentic copy
    with CrashproofSaver(url) as saver:
        with pytest.raises(cp.JournalRolledBack, match="rolled back"):
            saver.get_tuple(_config())
        with pytest.raises(cp.JournalRolledBack):
            _put(saver, {"x": 3})  # nothing is written on top of it either


def test_a_wrong_key_is_refused(url: str) -> None:
    with CrashproofSaver(url) as saver:
        _put(saver, {"x": 1})
    with CrashproofSaver(url, key="ab" * 32) as other, pytest.raises(cp.UnknownKeyId):
        other.get_tuple(_config())


def test_a_deleted_latest_checkpoint_is_refused(url: str) -> None:
    with CrashproofSaver(url) as saver:
        first = _put(saver, {"x": 1})
        second = _put(saver, {"x": 2}, parent=first)
    _sql(url, "DELETE FROM langgraph_checkpoints WHERE checkpoint_id = ?",
         second["configurable"]["checkpoint_id"])  # fmt: skip
    with CrashproofSaver(url) as saver, pytest.raises(cp.JournalTampered, match="missing"):
        saver.get_tuple(_config())  # not silently the older one


def test_a_second_writer_is_refused_then_fenced(url: str) -> None:
    with CrashproofSaver(url, lease_seconds=0.5) as first, CrashproofSaver(url) as second:
        stored = _put(first, {"x": 1})
        with pytest.raises(cp.LeaseHeld, match="being written by"):
            _put(second, {"x": 2})
        latest = first.get_tuple(_config())
        assert latest.checkpoint["id"] == stored["configurable"]["checkpoint_id"]  # kept out
        time.sleep(0.6)  # first's lease expires (a stalled process): second takes over
        _put(second, {"x": 3})
        with pytest.raises(cp.StaleLeaseError, match="taken over"):
            _put(first, {"x": 4})  # the late writer is fenced out, nothing kept
        assert second.get_tuple(_config()).checkpoint["channel_values"] == {"x": 3}
        second.release(THREAD)
        _put(first, {"x": 5})  # released: free at once for a new claim


def test_a_held_lease_outlasts_a_long_node_and_then_expires(url: str) -> None:
    with CrashproofSaver(url, lease_seconds=1.2) as first, CrashproofSaver(url) as second:
        _put(first, {"x": 1})
        with first.hold(THREAD):
            time.sleep(3.0)  # a node 2.5 leases long, nothing written: renewed meanwhile
            with pytest.raises(cp.LeaseHeld, match="being written by"):
                _put(second, {"x": 2})
            _put(first, {"x": 3})  # still first's, under the same token
        time.sleep(1.4)  # no renewal after the block: the lease runs out
        _put(second, {"x": 4})


def test_a_lease_taken_over_is_not_renewed(url: str, caplog: pytest.LogCaptureFixture) -> None:
    with CrashproofSaver(url, lease_seconds=1.2) as first:
        _put(first, {"x": 1})
        with first.hold(THREAD):
            # another owner took the thread (its lease had expired, say)
            _sql(url, "UPDATE langgraph_threads SET owner = 'elsewhere:1:x', token = token + 1")
            time.sleep(1.0)  # a renewal round: it finds the lease gone
            with pytest.raises(cp.StaleLeaseError, match="taken over"):
                _put(first, {"x": 2})
    assert "was taken over; not renewed" in caplog.text


def test_a_value_json_cannot_hold_writes_nothing(url: str) -> None:
    with CrashproofSaver(url) as saver:
        with pytest.raises(cp.SerializationError, match=r"builtins\.set has no JSON form"):
            _put(saver, {"x": {1, 2}})
        with pytest.raises(cp.SerializationError, match="string keys"):
            _put(saver, {"x": {1: "a"}})
        assert saver.get_tuple(_config()) is None
        stored = _put(saver, {"x": (1, b"\x00", {"__cp__": 1})})
        assert saver.get_tuple(stored).checkpoint["channel_values"] == {
            "x": (1, b"\x00", {"__cp__": 1})
        }


def test_a_growing_transcript_is_stored_as_its_new_items(url: str) -> None:
    with CrashproofSaver(url) as saver:
        config, messages, version = _config(), [], None
        for turn in range(150):
            messages = [*messages, f"message {turn} " + "x" * 100]
            version = saver.get_next_version(version, None)
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"messages": messages}
            checkpoint["channel_versions"] = {"messages": version}
            config = saver.put(config, checkpoint, {"step": turn}, {"messages": version})
        got = saver.get_tuple(_config())
        assert got.checkpoint["channel_values"]["messages"] == messages
    conn = sqlite3.connect(url[len("sqlite:///") :])
    stored = conn.execute("SELECT SUM(LENGTH(value)) FROM langgraph_blobs").fetchone()[0]
    conn.close()
    whole = sum(len(m) + 3 for m in messages)
    assert stored < 4 * whole  # a full copy every 64 versions, never one per turn (~75x)


def test_import_crashproof_does_not_import_langgraph() -> None:
    code = "import crashproof, sys; sys.exit('langgraph' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_on_postgres_rows_are_sealed_and_writers_fenced(pg_url: str, pg_server: Any) -> None:
    with (
        CrashproofSaver(pg_url, lease_seconds=1.2) as first,
        CrashproofSaver(pg_url) as second,
    ):
        stored = _put(first, {"messages": ["a", "b"]})
        with first.hold(THREAD):
            time.sleep(2.0)  # past its lease: renewed
            with pytest.raises(cp.LeaseHeld):
                _put(second, {"x": 2})
    pg_server.query(pg_url, "UPDATE crashproof_langgraph.langgraph_blobs SET value = '[]'")
    with CrashproofSaver(pg_url) as saver, pytest.raises(cp.JournalTampered):
        saver.get_tuple(stored)
