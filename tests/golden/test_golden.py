"""Golden journals of every released format, opened, migrated, replayed and verified on
every change (files: tests/golden/make_golden.py). Each test works on a copy."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import main
from crashproof.integrity import checkpoint
from crashproof.store.migrate import MigrationRequired
from crashproof.store.sqlite import SCHEMA_VERSION

HERE = Path(__file__).resolve().parent
EXPECTED = {  # what each golden run returns, recorded or finished now
    "g-done": {"summary": "LEDGERS", "note": {"title": "about ledgers"}},
    "g-inflight": {"summary": "JOURNALS", "note": {"title": "about journals"}},
}


@pytest.fixture
def flows(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, ModuleType]]:
    """The golden workflow module and its non-deterministic variant, freshly imported."""
    monkeypatch.syspath_prepend(str(HERE))
    for name in ("golden_flows", "golden_changed"):
        sys.modules.pop(name, None)
    import golden_changed
    import golden_flows

    golden_flows.Notes.sent.clear()
    yield {"flows": golden_flows, "changed": golden_changed}
    for name in ("golden_flows", "golden_changed"):
        sys.modules.pop(name, None)


def copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    for found in HERE.glob(name + "*"):
        shutil.copy(found, tmp_path / found.name)
    return target


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cli(*argv: str) -> int:
    return main(list(argv))


def test_schema1_refuses_to_open_until_migrated_then_migrates_replays_and_resumes(
    tmp_path: Path, flows: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy(tmp_path, "schema1.db")
    url = f"sqlite:///{path}"
    before = sha(path)
    with pytest.raises(MigrationRequired, match="crashproof migrate"):
        cp.Ledger(url)
    assert sha(path) == before  # refused before writing anything

    assert cli("migrate", "--db", url, "--preview") == 0
    plan = capsys.readouterr().out
    assert f"schema 1 -> {SCHEMA_VERSION}" in plan
    assert "new column runs.fencing_token INTEGER: 2 existing row(s) get 0" in plan
    assert "new column events.mac TEXT: 9 existing row(s) get NULL" in plan
    assert "seal 9 journal record(s) of 2 run(s)" in plan
    assert "UNRESOLVED" not in plan
    assert sha(path) == before  # the preview wrote nothing

    assert cli("migrate", "--db", url) == 0
    assert "migrated" in capsys.readouterr().out
    assert cli("check", "--db", url) == 0  # every record sealed, witness anchored
    assert cli("migrate", "--db", url, "--preview") == 0
    assert "nothing to migrate" in capsys.readouterr().out

    assert cli("replay", "golden_flows", "--from", str(path)) == 0
    assert cli("replay", "golden_changed", "--from", str(path)) == 4  # must fail
    out = capsys.readouterr().out
    assert "non-deterministic at step 1 (recorded step 'summarize' args" in out

    with cp.Ledger(url) as ledger:
        ledger.register(flows["flows"].golden)
        assert ledger.resume("g-done") == EXPECTED["g-done"]  # the recorded result
        assert ledger.resume("g-inflight") == EXPECTED["g-inflight"]  # finished now
        assert ledger.get_run("g-inflight").version == "1"
    assert list(flows["flows"].Notes.sent) == ["g-inflight/note"]  # one effect, new only


def test_an_unmappable_value_is_listed_and_blocks_the_migration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy(tmp_path, "schema1_unmappable.db")
    url = f"sqlite:///{path}"
    before = sha(path)
    assert cli("migrate", "--db", url, "--preview") == 4
    out = capsys.readouterr().out
    assert "UNRESOLVED: 1 row(s) of runs.status hold 'paused'" in out
    assert cli("migrate", "--db", url) == 4
    assert "block the migration" in capsys.readouterr().err
    assert sha(path) == before
    with pytest.raises(MigrationRequired, match="unresolved"):
        cp.Ledger(url)


@pytest.mark.parametrize("name", ["current.db", "schema4.db", "schema3.db"])
def test_the_current_format_and_schemas_3_and_4_open_verify_replay_and_resume(
    tmp_path: Path, flows: dict[str, Any], capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # Schema 3 keyed the journal by run id and seq; opening it rebuilds the table with
    # integer row ids (a relayout: no value changes), so every MAC still verifies.
    # Schemas 3 and 4 hold v1 MACs (a bare hex MAC): they verify as v1, and the records
    # the resume adds are sealed as v2 after them, in the same chain.
    path = copy(tmp_path, name)
    url = f"sqlite:///{path}"
    assert cli("check", "--db", url) == 0
    with contextlib.closing(sqlite3.connect(path)) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM crashproof_migrations")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert cli("replay", "golden_flows", "--from", url) == 0
    assert cli("replay", "golden_changed", "--from", url) == 4
    assert cli("runs", "--version", "--json", "--db", url) == 0
    capsys.readouterr()
    with cp.Ledger(url) as ledger:
        ledger.register(flows["flows"].golden)
        assert [r.run_id for r in ledger.runs()] == ["g-done", "g-inflight"]
        assert ledger.resume("g-inflight") == EXPECTED["g-inflight"]
        assert ledger.get_run("g-done").result == EXPECTED["g-done"]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        macs = [m for (m,) in conn.execute("SELECT mac FROM events WHERE run_id = 'g-inflight'")]
    assert macs[-1].startswith("v2:")  # the records the resume added
    assert all(m.startswith("v2:") for m in macs) == (name == "current.db")
    assert cli("check", "--db", url) == 0  # the mixed chain verifies


def test_the_exported_checkpoint_imports_and_replays(tmp_path: Path, flows: dict[str, Any]) -> None:
    document = HERE / "checkpoint.json"
    verdicts = cp.replay_check([flows["flows"].golden], document)
    assert [(v.run_id, v.status) for v in verdicts] == [("g-done", "compatible")]
    changed = cp.replay_check([flows["changed"].golden], document)
    assert changed[0].status == "non_deterministic"
    assert changed[0].step == 1
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert cli("import", str(document), "--by", "golden-test", "--db", url) == 0
    with cp.Ledger(url) as ledger:
        assert ledger.get_run("g-done").result == EXPECTED["g-done"]


def test_the_format_1_checkpoint_is_previewed_then_migrated_on_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = HERE / "checkpoint.json"
    assert json.loads(document.read_bytes())["schema_version"] == 1  # as released
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    with cp.Ledger(url):
        pass
    before = sha(tmp_path / "fresh.db")
    assert cli("import", str(document), "--preview", "--json", "--db", url) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["run_id"] == "g-done"
    assert plan["format"] == {"from": 1, "to": checkpoint.SCHEMA_VERSION}
    assert plan["action"] == "install"
    # Format 1 knew no moves: a copy. The run ended, so it can do nothing more: it is
    # installed as it was (a copy of a run still going would be installed frozen).
    assert (plan["transfer"], plan["installs_as"]) == ("copy", "succeeded")
    assert plan["derived"] == {
        "policy": None,
        "limits": None,
        "budget_used": {"steps": 3, "decisions": 1, "tokens": 5, "cost": 0.001},
        "approvals": {"granted": 0, "consumed": 0},
        "open_review_cases": [],
    }
    assert sha(tmp_path / "fresh.db") == before  # the preview wrote nothing
    assert cli("import", str(document), "--by", "golden-test", "--db", url) == 0
    assert f"format 1 migrated to {checkpoint.SCHEMA_VERSION}" in capsys.readouterr().err
    with cp.Ledger(url) as ledger:
        again = ledger.export_run("g-done", copy=True)
        assert ledger.get_run("g-done").status is cp.RunStatus.SUCCEEDED
    assert again["schema_version"] == checkpoint.WITHOUT_REQUESTS  # no requests: format 4
    assert again["records"][-1]["type"] == "run_imported"
    assert {k: again["run"][k] for k in plan["derived"]} == plan["derived"]


def test_the_format_2_checkpoint_imports_with_its_policy_approval_and_open_case(
    tmp_path: Path, flows: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    document = HERE / "checkpoint_v2.json"
    header = json.loads(document.read_bytes())["run"]
    assert json.loads(document.read_bytes())["schema_version"] == 2
    assert header["policy"]["version"] == "golden-policy-1"
    assert header["approvals"] == {"granted": 1, "consumed": 0}
    [case] = header["open_review_cases"]
    verdicts = cp.replay_check([flows["flows"].golden], document)
    assert [(v.run_id, v.status) for v in verdicts] == [("g-review", "compatible")]
    assert cp.replay_check([flows["changed"].golden], document)[0].status == "non_deterministic"
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert cli("import", str(document), "--preview", "--db", url) == 0
    out = capsys.readouterr().out
    assert "no ledger at" in out
    assert "would do: install the run" in out
    assert not (tmp_path / "fresh.db").exists()  # a preview never creates the ledger
    assert cli("import", str(document), "--by", "golden-test", "--db", url) == 0
    assert cli("import", str(document), "--preview", "--db", url) == 0
    out = capsys.readouterr().out
    assert f"format migration 2 -> {checkpoint.SCHEMA_VERSION}" in out
    assert f"{case['case_id']} (open) fingerprint {case['fingerprint'][:16]}" in out
    assert "would do: nothing" in out
    with cp.Ledger(url) as ledger:
        # Format 2 knew no moves: a copy, frozen on arrival (a new case supersedes the
        # one it held, whose evidence stays in the journal).
        [open_case] = ledger.review_cases("g-review", state="open")
        assert "imported from a copy" in open_case.reason
        [held] = [c for c in ledger.review_cases("g-review") if c.case_id == case["case_id"]]
        assert (held.fingerprint, held.state) == (case["fingerprint"], "superseded")
        assert ledger.get_run("g-review").policy == header["policy"]


def test_the_format_3_move_imports_runnable_and_resumes_without_asking_again(
    tmp_path: Path, flows: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    document = HERE / "checkpoint_v3.json"
    data = json.loads(document.read_bytes())
    assert data["schema_version"] == 3
    assert data["records"][-1]["type"] == "run_moved"
    verdicts = cp.replay_check([flows["flows"].golden], document)
    assert [(v.run_id, v.status) for v in verdicts] == [("g-moved", "compatible")]
    asked: list[str] = []
    original = flows["flows"].plan
    monkeypatch.setattr(
        flows["flows"], "plan", lambda topic: asked.append(topic) or original(topic)
    )
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert cli("import", str(document), "--by", "golden-test", "--db", url) == 0
    with cp.Ledger(url) as ledger:
        ledger.register(flows["flows"].golden)
        assert ledger.get_run("g-moved").status is cp.RunStatus.RUNNING
        assert ledger.resume("g-moved") == {"summary": "MOVES", "note": {"title": "about moves"}}
        steps = {s.key: s for s in ledger.get_run("g-moved").steps}
    assert asked == []  # the recorded decision travelled with the move
    assert flows["flows"].Notes.sent == {"g-moved/note": {"title": "about moves", "body": "MOVES"}}
    # took_us (this format's successful steps) reads back as start and end times.
    summarize = steps["summarize"]
    assert summarize.started_at is not None
    assert summarize.ended_at is not None
    assert summarize.started_at <= summarize.ended_at
