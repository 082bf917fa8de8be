"""`crashproof check`, `reanchor` and `keygen`."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result


def test_check_finds_a_tampered_record(project: Path, cli: Cli) -> None:
    assert cli("run", "flows:greet", "--run-id", "g1", "--arg", "name=ada").code == 0
    assert cli("run", "flows:greet", "--run-id", "g2", "--arg", "name=bob").code == 0
    ok = cli("check", "--json")
    assert ok.code == 0
    assert [r["ok"] for r in ok.json()] == [True, True]
    conn = sqlite3.connect(project / "crashproof.db")
    conn.execute("UPDATE events SET value = '\"hello eve\"' WHERE run_id = 'g1' AND seq = 1")
    conn.commit()
    conn.close()
    bad = cli("check")
    assert bad.code == 5
    assert "CORRUPT   g1" in bad.out
    assert "ok        g2" in bad.out
    shown = cli("show", "g1")  # reading a tampered run fails closed too
    assert shown.code == 5
    assert "does not match its MAC" in shown.err


def test_check_finds_an_altered_and_a_missing_request(project: Path, cli: Cli) -> None:
    for run_id, name in (("g1", "ada"), ("g2", "bob"), ("g3", "cy")):
        assert cli("run", "flows:greet", "--run-id", run_id, "--arg", f"name={name}").code == 0
    assert cli("check").code == 0
    conn = sqlite3.connect(project / "crashproof.db")
    # Each run's one decision (choose) keeps its request under its record's row id.
    record = "(SELECT run_no << 32 FROM runs WHERE run_id = ?) + 2"
    altered = conn.execute(
        f"UPDATE requests SET text = replace(text, '1', '7') WHERE record = {record}", ("g1",)
    )
    assert altered.rowcount == 1
    assert conn.execute(f"DELETE FROM requests WHERE record = {record}", ("g2",)).rowcount == 1
    conn.commit()
    conn.close()
    bad = cli("check")
    assert bad.code == 5
    shown = " ".join(bad.out.split())
    assert "CORRUPT g1: IntegrityError: run 'g1': stored model requests do not match" in shown
    assert "the request of record 2: altered" in shown
    assert "CORRUPT g2" in shown
    assert "the request of record 2: missing" in shown
    assert "ok g3" in shown
    assert "3 run(s) checked, 2 with problems" in shown
    found = cli("check", "--json")
    assert found.code == 5
    assert [(r["run_id"], r["ok"]) for r in found.json()] == [
        ("g1", False),
        ("g2", False),
        ("g3", True),
    ]
    assert "altered" in found.json()[0]["problem"]
    assert cli("check", "g3").code == 0


def test_reanchor_after_a_lost_witness(project: Path, cli: Cli) -> None:
    assert cli("run", "flows:greet", "--run-id", "g1", "--arg", "name=ada").code == 0
    (project / "crashproof.db.witness").unlink()
    lost = cli("show", "g1")
    assert lost.code == 5
    assert "reanchor" in lost.err
    assert cli("reanchor", "g1").code == 2  # --by is required
    assert cli("reanchor", "g1", "--by", "ops").code == 0
    assert cli("show", "g1").code == 0


def test_keygen(project: Path, cli: Cli) -> None:
    printed = cli("keygen")
    assert printed.code == 0
    assert len(printed.out.strip()) == 64
    made = cli("keygen", "--file", "k.hex")
    assert made.code == 0
    assert oct((project / "k.hex").stat().st_mode & 0o777) == "0o600"
    assert cli("keygen", "--file", "k.hex").code == 2  # never overwritten
