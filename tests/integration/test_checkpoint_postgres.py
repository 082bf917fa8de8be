"""Checkpoints move runs between stores: SQLite → PostgreSQL → SQLite, blob-sized values
included, resumed without executing recorded steps; PostgreSQL refuses what SQLite does."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.integrity import checkpoint
from integration.test_checkpoint import KEY, Calls, crashed_run, ledger_at, make


def test_sqlite_to_postgres_and_back(tmp_path: Path, pg_url: str) -> None:
    calls = Calls()
    with ledger_at(crashed_run(tmp_path, calls)) as source:
        document = source.export_run("r")
    with cp.Ledger(pg_url, key=KEY) as pg:
        assert pg.import_run(checkpoint.parse(checkpoint.serialize(document)), by="alice") == "r"
        assert pg.check() == [("r", None)]
        assert pg.import_run(document, by="alice") == "r"  # the same checkpoint: a no-op
        again = pg.export_run("r")  # moved on again: PostgreSQL refuses it from now on
        with pytest.raises(cp.RunMoved, match="was exported at generation 7"):
            pg.run(make(calls), run_id="r")
    n = len(document["records"])
    assert again["records"][:n] == document["records"]  # the very bytes, blob included
    assert [r["type"] for r in again["records"][n:]] == ["run_imported", "run_moved"]
    with ledger_at(tmp_path / "c.db") as target:
        target.import_run(again, by="bob")
        calls.made.clear()
        result = target.run(make(calls), run_id="r")
    assert result[1].startswith("v1x")
    assert result[3] == "v3"
    assert calls.made == ["s3"], "a recorded step ran again after two moves"


def test_postgres_refuses_a_tampered_checkpoint(tmp_path: Path, pg_url: str) -> None:
    with ledger_at(crashed_run(tmp_path, Calls())) as source:
        document = source.export_run("r")
    bad = copy.deepcopy(document)
    bad["records"][2]["payload"] = bad["records"][2]["payload"].replace("succeeded", "failed!!!")
    bad = checkpoint.sign(bad, cp.Keyring.from_hex(KEY))  # re-signed: only the MACs tell
    with cp.Ledger(pg_url, key=KEY) as pg:
        with pytest.raises(cp.IntegrityError):
            pg.import_run(bad, by="alice")
        assert pg.runs() == []
