"""Signed checkpoint export/import: a run moves to another ledger and resumes there
without executing its recorded steps; any altered, incomplete or foreign checkpoint is
refused with a specific message and nothing is written."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity import checkpoint
from crashproof.integrity.keys import Keyring
from crashproof.store.port import BLOB_THRESHOLD

KEY = "ab" * 32
OTHER_KEY = "cd" * 32

# Every test with the native seal and with the Python one (an install without it).
pytestmark = pytest.mark.usefixtures("seal_implementation")


class Calls:
    def __init__(self) -> None:
        self.made: list[str] = []


def make(calls: Calls, steps: int = 4) -> cp.Workflow[list[str]]:
    @cp.workflow("transfer", version="1")
    def flow(ctx: cp.Context) -> list[str]:
        out: list[str] = []
        for k in range(steps):

            def body(k: int = k) -> str:
                calls.made.append(f"s{k}")
                return f"v{k}" + ("x" * BLOB_THRESHOLD if k == 1 else "")  # s1: a blob-sized value

            out.append(ctx.step(f"s{k}", body))
        return out

    return flow


def ledger_at(path: Path, key: str = KEY, **kw: Any) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{path}", key=key, **kw)


def crashed_run(tmp_path: Path, calls: Calls) -> Path:
    """Run "r" in a.db with s0..s2 recorded and s3 not (a crash before its commit)."""
    db = tmp_path / "a.db"
    points = cp.CrashPoints(match="before_commit[step_done:s3]")
    ledger = ledger_at(db, crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(make(calls), run_id="r")
    ledger.close()
    return db


def exported(tmp_path: Path) -> dict[str, Any]:
    calls = Calls()
    db = crashed_run(tmp_path, calls)
    with ledger_at(db) as ledger:
        return ledger.export_run("r", copy=True)


def resign(document: dict[str, Any], key: str = KEY) -> dict[str, Any]:
    """Signed again by someone who holds the key (the records keep their own MACs)."""
    return checkpoint.sign(document, Keyring.from_hex(key))


def refused(tmp_path: Path, document: Any, error: type[Exception] = cp.CheckpointRejected) -> str:
    target = tmp_path / "b.db"
    ledger = ledger_at(target)
    with pytest.raises(error) as caught:
        ledger.import_run(document, by="alice")
    assert isinstance(caught.value, cp.IntegrityError)
    assert ledger.runs() == [], "a refused import wrote something"
    ledger.close()
    rows = sqlite3.connect(target).execute("SELECT count(*) FROM events").fetchone()
    assert rows == (0,)
    return str(caught.value)


def test_export_import_resume_replays_without_executing(tmp_path: Path) -> None:
    calls = Calls()
    db = crashed_run(tmp_path, calls)
    assert calls.made == ["s0", "s1", "s2", "s3"]  # s3 ran, its commit crashed
    with ledger_at(db) as source:
        document = source.export_run("r")  # a move: the source journals it left
    assert document["run"]["generation"] == len(document["records"]) == 5
    assert document["records"][-1]["type"] == "run_moved"
    text = checkpoint.serialize(document)
    with ledger_at(tmp_path / "b.db") as target:
        assert target.import_run(checkpoint.parse(text + b"\n"), by="alice") == "r"
        assert target.check() == [("r", None)]
        calls.made.clear()
        result = target.run(make(calls), run_id="r")
        assert result[0] == "v0"
        assert result[3] == "v3"
        assert calls.made == ["s3"], "a recorded step ran again after import"
        assert target.get_run("r").status is cp.RunStatus.SUCCEEDED


def test_reimporting_the_same_checkpoint_is_a_no_op(tmp_path: Path) -> None:
    document = exported(tmp_path)
    with ledger_at(tmp_path / "b.db") as target:
        target.import_run(document, by="alice")
        assert target.import_run(document, by="alice") == "r"
        kept = target.export_run("r", copy=True)["records"]
        assert [r["type"] for r in kept[4:]] == ["run_imported", "run_frozen"]  # once


def test_an_existing_run_with_another_journal_is_refused(tmp_path: Path) -> None:
    document = exported(tmp_path)
    with ledger_at(tmp_path / "a.db") as source:
        source.run(make(Calls()), run_id="r")  # a.db's run moves on
        with pytest.raises(cp.CheckpointRejected, match=r"already exists .* another journal"):
            source.import_run(document, by="alice")


def test_import_into_the_same_witness_cannot_roll_back(tmp_path: Path) -> None:
    document = exported(tmp_path)
    with ledger_at(tmp_path / "b.db") as target:
        target.run(make(Calls()), run_id="r")  # gen 6 witnessed in b.db.witness
    (tmp_path / "b.db").unlink()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"b.db{suffix}").unlink(missing_ok=True)
    message = refused(tmp_path, document)
    assert "roll the run back" in message


def test_tampered_record_payload_is_refused(tmp_path: Path) -> None:
    document = exported(tmp_path)
    bad = copy.deepcopy(document)
    record = bad["records"][2]
    record["payload"] = record["payload"].replace('"attempt":1', '"attempt":2')
    assert record["payload"] != document["records"][2]["payload"]
    assert "signature does not verify" in refused(tmp_path, bad)
    # Re-signed by someone holding the key: the record's own MAC still catches it.
    assert "record 2 does not match its MAC" in refused(tmp_path, resign(bad))


def test_changed_signature_is_refused(tmp_path: Path) -> None:
    bad = exported(tmp_path)
    bad["signature"] = ("0" if bad["signature"][0] != "0" else "1") + bad["signature"][1:]
    assert "signature does not verify" in refused(tmp_path, bad)
    del bad["signature"]
    assert "no signature" in refused(tmp_path, bad)


def test_unknown_field_is_refused_at_every_level(tmp_path: Path) -> None:
    document = exported(tmp_path)
    for where in ("top", "run", "record"):
        bad = copy.deepcopy(document)
        {"top": bad, "run": bad["run"], "record": bad["records"][1]}[where]["extra"] = 1
        assert "unknown field 'extra'" in refused(tmp_path, resign(bad))


def test_newer_schema_is_refused_naming_both_versions(tmp_path: Path) -> None:
    bad = exported(tmp_path)
    newer = checkpoint.SCHEMA_VERSION + 1
    bad["schema_version"] = newer
    message = refused(tmp_path, resign(bad))
    assert f"schema version {newer} is newer" in message
    assert f"up to {checkpoint.SCHEMA_VERSION}" in message


def test_wrong_key_is_refused(tmp_path: Path) -> None:
    document = exported(tmp_path)
    target = ledger_at(tmp_path / "b.db", key=OTHER_KEY)
    with pytest.raises(cp.UnknownKeyId, match="checkpoint was signed with key id"):
        target.import_run(document, by="alice")
    assert target.runs() == []
    target.close()


def test_generation_mismatch_is_refused(tmp_path: Path) -> None:
    bad = exported(tmp_path)
    bad["run"]["generation"] = 3
    assert "generation 3 does not match its 4 record(s)" in refused(tmp_path, resign(bad))


def test_a_removed_record_is_refused(tmp_path: Path) -> None:
    document = exported(tmp_path)
    bad = copy.deepcopy(document)
    del bad["records"][1]
    bad["run"]["generation"] = 3
    assert "sequence 2 where 1 was expected" in refused(tmp_path, resign(bad))
    last = copy.deepcopy(document)  # the last record removed: only the generation tells
    del last["records"][-1]
    assert "generation 4 does not match its 3" in refused(tmp_path, resign(last))
    renumbered = copy.deepcopy(bad)
    for i, record in enumerate(renumbered["records"]):
        record["seq"] = i
    assert "record 1 does not match its MAC" in refused(tmp_path, resign(renumbered))


def test_run_header_must_match_the_journal(tmp_path: Path) -> None:
    bad = exported(tmp_path)
    bad["run"]["workflow"] = "other"
    assert "run workflow 'other' differs" in refused(tmp_path, resign(bad))


def test_file_form_must_be_canonical(tmp_path: Path) -> None:
    document = exported(tmp_path)
    pretty = json.dumps(document, indent=2).encode()
    with pytest.raises(cp.CheckpointRejected, match="canonical form"):
        checkpoint.parse(pretty)
    with pytest.raises(cp.CheckpointRejected, match="not valid UTF-8 JSON"):
        checkpoint.parse(b"{")
    with pytest.raises(cp.CheckpointRejected, match="repeats field"):
        checkpoint.parse(b'{"a":1,"a":1}')
    assert checkpoint.parse(checkpoint.serialize(document)) == document


def test_cli_export_then_import(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from crashproof.cli.app import app

    crashed_run(tmp_path, Calls())
    out = tmp_path / "run.json"
    env = {"CRASHPROOF_KEY": KEY}
    runner = CliRunner()
    done = runner.invoke(
        app, ["export", "r", "--out", str(out), "--db", f"sqlite:///{tmp_path / 'a.db'}"], env=env
    )
    assert done.exit_code == 0, done.output
    target = f"sqlite:///{tmp_path / 'b.db'}"
    done = runner.invoke(app, ["import", str(out), "--by", "alice", "--db", target], env=env)
    assert done.exit_code == 0, done.output
    data = bytearray(out.read_bytes())
    data[40] ^= 1
    out.write_bytes(bytes(data))
    done = runner.invoke(
        app,
        ["import", str(out), "--by", "alice", "--db", f"sqlite:///{tmp_path / 'c.db'}"],
        env=env,
    )
    assert done.exit_code != 0
