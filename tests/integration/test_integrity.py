"""The HMAC-chained journal and the generation witness: any altered, removed, moved,
spliced or rolled-back record fails closed before anything executes."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from integration._targets import Target, TargetTool

KEY = "ab" * 32
OTHER_KEY = "cd" * 32

# Every test with the native seal and with the Python one (an install without it).
pytestmark = pytest.mark.usefixtures("seal_implementation")


def make(target: Target) -> cp.Workflow[list[Any]]:
    tool = TargetTool(target)

    @cp.workflow("integrity", version="1")
    def flow(ctx: cp.Context) -> list[Any]:
        out: list[Any] = []
        for k in range(4):
            out.append(ctx.step(f"s{k}", lambda k=k: f"+line-{k}"))
        out.append(ctx.act("create", tool, size="s"))
        return out

    return flow


def open_ledger(tmp_path: Path, key: str = KEY, **kw: Any) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=key, **kw)


def crashed_before_act(tmp_path: Path) -> Target:
    """A run whose 4 steps are recorded; the act is next (crash before its intent)."""
    target = Target(tmp_path / "t.json")
    points = cp.CrashPoints(match="before_commit[act_intent:create]")
    ledger = open_ledger(tmp_path, crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(make(target), run_id="r")
    ledger.close()
    return target


def crash_at(tmp_path: Path, target: Target, point: str) -> None:
    ledger = open_ledger(tmp_path, crash_points=cp.CrashPoints(match=point))
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(make(target), run_id="r")
    ledger.close()


def resume_fails(tmp_path: Path, target: Target, error: type[Exception]) -> Exception:
    ledger = open_ledger(tmp_path)
    with pytest.raises(error) as caught:
        ledger.run(make(target), run_id="r")
    ledger.close()
    assert target.count("executes", "r/create") == 0, "a tool ran on a bad journal"
    return caught.value


def edit(tmp_path: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(tmp_path / "l.db")
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def test_sound_journal_resumes(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    assert open_ledger(tmp_path).run(make(target), run_id="r")[0] == "+line-0"
    assert target.count("executes", "r/create") == 1


def test_same_length_edit_of_a_value_is_caught(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    edit(tmp_path, "UPDATE events SET value = '\"+line-9\"' WHERE run_id = 'r' AND seq = 2")
    error = resume_fails(tmp_path, target, cp.JournalTampered)
    assert "record 2" in str(error)


def test_byte_flip_in_the_file_is_caught(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    conn = sqlite3.connect(tmp_path / "l.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the records now sit in the main file
    conn.close()
    data = (tmp_path / "l.db").read_bytes()
    at = data.index(b"+line-3")
    (tmp_path / "l.db").write_bytes(data[:at] + b"+line-8" + data[at + 7 :])
    resume_fails(tmp_path, target, cp.IntegrityError)


def test_deleted_middle_record_is_caught(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    edit(tmp_path, "DELETE FROM events WHERE run_id = 'r' AND seq = 2")
    resume_fails(tmp_path, target, cp.IntegrityError)


def test_reordered_records_are_caught(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    # Records 2 and 3 trade places: each row keeps its row id and seq (the table's CHECK
    # ties them together) and takes the other's content.
    conn = sqlite3.connect(tmp_path / "l.db")
    conn.executescript(
        "CREATE TEMP TABLE two AS SELECT * FROM events WHERE run_id = 'r' AND seq IN (2, 3);"
        "UPDATE events SET (type, key, payload, value, blob, created_at, key_id, mac) = "
        "(SELECT type, key, payload, value, blob, created_at, key_id, mac FROM two "
        " WHERE two.seq = 5 - events.seq) WHERE run_id = 'r' AND seq IN (2, 3);"
    )
    conn.close()
    resume_fails(tmp_path, target, cp.JournalTampered)


def test_record_spliced_from_another_run_is_caught(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    other = open_ledger(tmp_path)

    @cp.workflow("other", version="1")
    def other_flow(ctx: cp.Context) -> None:
        for k in range(4):
            ctx.step(f"s{k}", lambda: "+line-X")

    other.run(other_flow, run_id="o")
    other.close()
    edit(tmp_path, "DELETE FROM events WHERE run_id = 'r' AND seq = 2")
    edit(
        tmp_path,
        "INSERT INTO events SELECT ((SELECT run_no FROM runs WHERE run_id = 'r') << 32) + seq, "
        "'r', seq, type, key, payload, value, blob, created_at, key_id, mac FROM events "
        "WHERE run_id = 'o' AND seq = 2",
    )
    resume_fails(tmp_path, target, cp.JournalTampered)


def test_a_record_moved_into_another_runs_place_is_caught(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    edit(tmp_path, "UPDATE events SET run_id = 'o' WHERE run_id = 'r' AND seq = 2")
    error = resume_fails(tmp_path, target, cp.IntegrityError)
    assert "record 2 is stored among this run's records but names another run" in str(error)


def test_restored_older_copy_is_refused(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    points = cp.CrashPoints(match="before_commit[step_done:s2]")
    ledger = open_ledger(tmp_path, crash_points=points)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(make(target), run_id="r")
    ledger.close()
    backup = tmp_path / "backup"
    backup.mkdir()
    for name in ("l.db", "l.db-wal"):
        if (tmp_path / name).exists():
            shutil.copy(tmp_path / name, backup / name)
    # The run goes on past an output (the act executes), then dies before finishing.
    late = open_ledger(tmp_path, crash_points=cp.CrashPoints(match="before_commit[run_succeeded]"))
    with pytest.raises(cp.SimulatedCrash):
        late.run(make(target), run_id="r")
    late.close()
    for name in ("l.db", "l.db-wal", "l.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
        if (backup / name).exists():
            shutil.copy(backup / name, tmp_path / name)  # the VM snapshot comes back
    ledger = open_ledger(tmp_path)
    with pytest.raises(cp.JournalRolledBack) as caught:
        ledger.run(make(target), run_id="r")
    assert "journal holds 3" in str(caught.value)
    assert target.count("executes", "r/create") == 1  # not executed a second time


def test_rollback_of_local_steps_only_is_like_a_crash(tmp_path: Path) -> None:
    """Records nobody outside saw (local steps) may be lost like in a crash: the witness
    advances only where something leaves the process."""
    target = Target(tmp_path / "t.json")
    crash_at(tmp_path, target, "before_commit[step_done:s1]")
    shutil.copy(tmp_path / "l.db", tmp_path / "old.db")
    if (tmp_path / "l.db-wal").exists():
        shutil.copy(tmp_path / "l.db-wal", tmp_path / "old.db-wal")
    crash_at(tmp_path, target, "before_commit[step_done:s3]")
    for name in ("l.db-wal", "l.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    shutil.copy(tmp_path / "old.db", tmp_path / "l.db")
    if (tmp_path / "old.db-wal").exists():
        shutil.copy(tmp_path / "old.db-wal", tmp_path / "l.db-wal")
    assert open_ledger(tmp_path).run(make(target), run_id="r")[-1] == {"id": "rec-1"}
    assert target.count("executes", "r/create") == 1


def test_crash_between_commit_and_witness_update_resumes(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    # The act's intent is an output point: crash after its commit, before the witness.
    points = cp.CrashPoints(match="after_commit[act_intent:create]")
    with pytest.raises(cp.SimulatedCrash):
        open_ledger(tmp_path, crash_points=points).run(make(target), run_id="r")
    witness = sqlite3.connect(tmp_path / "l.db.witness", isolation_level=None)
    # The witness advances with the forced sync of an output point (the group sync's
    # leader writes it before anyone goes on): here the act's intent, seq 5, the first.
    assert witness.execute("SELECT generation FROM witness").fetchone() == (6,)
    # A crash between that sync and the witness write (or a power cut losing the write,
    # which is not synced) leaves the witness where it was: the run's start and its
    # local steps were never witnessed.
    witness.execute("UPDATE witness SET generation = 0")
    result = open_ledger(tmp_path).run(make(target), run_id="r")
    assert result[:4] == ["+line-0", "+line-1", "+line-2", "+line-3"]
    assert witness.execute("SELECT generation FROM witness").fetchone()[0] >= 8


def test_missing_witness_is_refused_until_reanchored(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    witness = sqlite3.connect(tmp_path / "l.db.witness")
    witness.execute("DELETE FROM witness")
    witness.commit()
    resume_fails(tmp_path, target, cp.WitnessMissing)
    ledger = open_ledger(tmp_path)
    syncs = ledger._store.syncs  # type: ignore[attr-defined]
    assert ledger.reanchor("r", by="ops@example") == 5
    # The re-anchored generation is made durable first: a power cut never leaves the
    # witness ahead of the journal on disk.
    assert ledger._store.syncs == syncs + 1  # type: ignore[attr-defined]
    assert ledger.run(make(target), run_id="r")[-1] == {"id": "rec-1"}


def test_wrong_key_is_refused_without_showing_it(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=OTHER_KEY)
    with pytest.raises(cp.UnknownKeyId) as caught:
        ledger.run(make(target), run_id="r")
    assert OTHER_KEY not in str(caught.value)
    assert KEY not in str(caught.value)
    assert target.count("executes", "r/create") == 0
    with pytest.raises(cp.UnknownKeyId):
        ledger.get_run("r")


def test_key_rotation_verifies_old_records(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    ring = cp.Keyring.from_hex(OTHER_KEY, KEY)  # new current key, old one kept
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=ring)
    assert ledger.run(make(target), run_id="r")[0] == "+line-0"
    conn = sqlite3.connect(tmp_path / "l.db")
    ids = {row[0] for row in conn.execute("SELECT key_id FROM events WHERE run_id = 'r'")}
    assert len(ids) == 2  # old records under the old key, new ones under the new


def test_key_file_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRASHPROOF_KEY", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o644)
    monkeypatch.setenv("CRASHPROOF_KEY_FILE", str(key_file))
    with pytest.raises(cp.KeyUnusable, match="chmod 600"):
        cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    key_file.chmod(0o600)
    cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}").close()
    monkeypatch.setenv("CRASHPROOF_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(cp.KeyUnusable, match="does not exist"):
        cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    monkeypatch.delenv("CRASHPROOF_KEY_FILE")
    monkeypatch.setenv("CRASHPROOF_KEY", "not hex")
    with pytest.raises(cp.KeyUnusable, match="not valid hex") as caught:
        cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    assert "not hex" not in str(caught.value)


def test_no_key_is_refused_and_no_key_file_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library call never writes a key to the home directory (#41): without a key the
    Ledger refuses to open, says how to make one, and writes nothing; `crashproof keygen
    --default` makes the default key file (0600), which every later Ledger uses."""
    monkeypatch.delenv("CRASHPROOF_KEY", raising=False)
    monkeypatch.delenv("CRASHPROOF_KEY_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with pytest.raises(cp.KeyUnusable, match="crashproof keygen --default"):
        cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    assert not (tmp_path / "config").exists()
    assert not (tmp_path / "l.db").exists()
    from crashproof.cli import main

    assert main(["keygen", "--default"]) == 0
    key_file = tmp_path / "config" / "crashproof" / "key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    first = key_file.read_text()
    cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}").close()
    assert main(["keygen", "--default"]) == 2  # never overwritten
    assert key_file.read_text() == first


def test_check_reports_each_run(tmp_path: Path) -> None:
    crashed_before_act(tmp_path)
    ledger = open_ledger(tmp_path)

    @cp.workflow("fine", version="1")
    def fine(ctx: cp.Context) -> int:
        return ctx.step("one", lambda: 1)

    ledger.run(fine, run_id="ok")
    edit(tmp_path, "UPDATE events SET value = '\"+line-9\"' WHERE run_id = 'r' AND seq = 2")
    report = dict(ledger.check())
    assert report["ok"] is None
    assert report["r"] is not None
    assert report["r"].startswith("JournalTampered")


def test_the_run_index_is_a_cache_never_trusted(tmp_path: Path) -> None:
    target = crashed_before_act(tmp_path)
    edit(tmp_path, "UPDATE runs SET status = 'succeeded', reason = 'forged' WHERE run_id = 'r'")
    ledger = open_ledger(tmp_path)
    info = ledger.get_run("r")
    assert info.status is cp.RunStatus.RUNNING  # folded from the journal
    assert info.reason is None
    assert [i.run_id for i in ledger.runs(status="running")] == ["r"]
    assert ledger.runs(status="succeeded") == []
    assert ledger.run(make(target), run_id="r")[-1] == {"id": "rec-1"}  # replay unaffected


def _generation(tmp_path: Path) -> int | None:
    with open_ledger(tmp_path) as ledger:
        witness = ledger.witness
        assert witness is not None
        return witness.get("r")


def test_a_refused_state_never_advances_the_witness(tmp_path: Path) -> None:
    # Unproven before (#28): whatever is refused (a tampered journal, a frozen run asked
    # to go on) leaves the witnessed generation where it was, so nothing refused can
    # later pass for a newer state.
    target = crashed_before_act(tmp_path)
    before = _generation(tmp_path)
    edit(tmp_path, "UPDATE events SET value = '\"+line-9\"' WHERE run_id = 'r' AND seq = 2")
    resume_fails(tmp_path, target, cp.JournalTampered)
    assert _generation(tmp_path) == before

    frozen = tmp_path / "frozen"
    frozen.mkdir()
    crash = cp.CrashPoints(match="before_commit[run_succeeded]")
    with open_ledger(frozen, crash_points=crash) as ledger:

        @ledger.workflow("stuck", version="1")
        def recorded(ctx: cp.Context) -> Any:
            return ctx.step("a", lambda: 1)

        with pytest.raises(cp.SimulatedCrash):
            ledger.run(recorded, run_id="r")
    with open_ledger(frozen) as ledger:

        @ledger.workflow("stuck", version="1")
        def changed(ctx: cp.Context) -> Any:
            return ctx.step("b", lambda: 2)  # the journal holds "a" here: non-determinism

        with pytest.raises(cp.RunFrozen):
            ledger.resume("r")
        witness = ledger.witness
        assert witness is not None
        generation = witness.get("r")
        for _ in range(3):  # each resume is refused: the run waits for a review
            with pytest.raises(cp.RunFrozen):
                ledger.resume("r")
        assert witness.get("r") == generation
        assert len(ledger.journal("r")) == generation
