"""Rebuild the golden journals in this folder. Run from the repository root:

    .venv/bin/python tests/golden/make_golden.py

Only when a new format is released: the files are committed, and CI opens, migrates and
replays them on every change (tests/golden/test_golden.py). They are sealed with the test
key of tests/conftest.py (never a real key).

- schema1.db: a SQLite ledger at schema 1, built from migration 0001 (not by hand) and
  holding records exactly as crashproof wrote them before schema 2 (no MAC, no witness):
  run g-done (succeeded) and g-inflight (crashed after its decision, before its act).
- schema1_unmappable.db: the same, with one run whose status ('paused') no crashproof
  knows and no migration maps: preview lists it, migrate refuses.
- schema3.db (+ schema3.db.witness): the same two runs at schema 3, sealed (the journal
  keyed by run id and seq, before schema 4's integer row ids): opening it migrates on
  its own (a relayout). No longer written here: a released format's file is kept.
- schema4.db (+ schema4.db.witness): the same two runs at schema 4, sealed with MAC
  format v1 (a bare hex MAC): opening it migrates to schema 5 (a number only) and its
  records keep verifying as v1, while new ones are sealed as v2. No longer written here.
- current.db (+ current.db.witness): the same two runs at the current schema, sealed
  (MAC format v2). Written alone by ``make_golden.py current``.
- checkpoint.json: run g-done exported from current.db in checkpoint format 1, as
  released (crashproof now exports format 2 and migrates this one on import). No longer
  written here: a released format's file is kept as it was.
- checkpoint_v2.json: checkpoint format 2 of run g-review: bound to a policy that needs
  an approval for the note (granted by the test approver, not yet consumed), with
  limits, its decision recorded, then resumed by golden_changed: frozen on the
  non-determinism, one open review case. Written alone by
  ``make_golden.py checkpoint_v2`` (the other files are left as they are).
- checkpoint_v3.json: checkpoint format 3, a **move** of run g-moved: crashed after its
  decision (the successful steps' records carry ``took_us``), then exported, so its last
  record is ``run_moved``. Imported elsewhere it is the run's one continuation: runnable,
  and its resume asks no decision again. Written alone by ``make_golden.py checkpoint_v3``.
- transcript1.db (+ .witness): the agent loop of golden_transcript.py (a message list
  passed whole to ``ctx.decide`` each turn) with arguments digest format 1, as crashproof
  wrote it before format 2 (#22; built at commit 715fd4e): run t-done (4 turns) and
  t-inflight (crashed after its third turn). No longer written here (this code writes
  format 2); tests/golden/test_golden_transcript.py replays and resumes it.
- deltas7.db (+ .witness): SQLite schema 7, step results stored as text deltas (a
  step returning the whole history, golden_deltas.py): run d-done (10 turns) and
  d-inflight (crashed after its seventh turn). Written alone by ``make_golden.py
  deltas7``; tests/golden/test_golden_deltas.py checks, replays and resumes it.
- requests8.db (+ .witness): SQLite schema 8, each decision's request stored inline in
  its record (``store_requests=True`` before requests were kept beside their records;
  golden_requests.py, built at commit 46696e9): run q-done (3 turns) and q-inflight
  (crashed after its second turn). No longer written here (this code keeps requests
  beside their records); tests/golden/test_golden_requests.py shows and resumes it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST_KEY = "5e" * 32  # tests/conftest.py's key
os.environ["CRASHPROOF_KEY"] = TEST_KEY
sys.path.insert(0, str(HERE))

from golden_flows import golden  # noqa: E402

import crashproof as cp  # noqa: E402
from crashproof.integrity.checkpoint import serialize  # noqa: E402
from crashproof.journal.codec import encode  # noqa: E402
from crashproof.store.memory import MemoryStore  # noqa: E402
from crashproof.store.sql import load_migrations  # noqa: E402

RUNS = {"g-done": "ledgers", "g-inflight": "journals"}
CRASH = "after_commit[step_done:plan]"


def record(ledger_url: str) -> None:
    """Run g-done to the end and g-inflight until a crash after its decision."""
    with cp.Ledger(ledger_url) as ledger:
        ledger.run(golden, run_id="g-done", topic=RUNS["g-done"])
    crash_after_decision(ledger_url, "g-inflight", RUNS["g-inflight"])


def crash_after_decision(ledger_url: str, run_id: str, topic: str) -> None:
    """Run ``run_id`` of the golden workflow until the crash after its decision."""
    crashing = cp.Ledger(ledger_url, crash_points=cp.CrashPoints(match=CRASH))
    try:
        crashing.run(golden, run_id=run_id, topic=topic)
    except cp.SimulatedCrash:
        pass
    else:
        raise SystemExit("the crash point was not reached")
    finally:
        crashing.close()


def schema1(path: Path, *, status_override: str | None = None) -> None:
    """Schema 1 from its migration file; records written as schema-1 crashproof did."""
    path.unlink(missing_ok=True)
    memory = MemoryStore()  # the records, exactly as the runtime builds them
    cp.Ledger("memory://", store=memory).run(golden, run_id="g-done", topic=RUNS["g-done"])
    crashing = cp.Ledger("memory://", store=memory, crash_points=cp.CrashPoints(match=CRASH))
    with contextlib.suppress(cp.SimulatedCrash):
        crashing.run(golden, run_id="g-inflight", topic=RUNS["g-inflight"])
    first = load_migrations("sqlite")[0]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(first.sql)
        conn.execute("INSERT INTO crashproof_meta VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO crashproof_migrations VALUES (1, ?, 1767225600.0)", (first.name,))
        for run_id in RUNS:
            row = memory.get_run(run_id)
            if row is None:
                raise SystemExit(f"run {run_id} missing")
            status = status_override if status_override and run_id == "g-inflight" else None
            conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.run_id,
                    row.workflow,
                    row.version,
                    status or row.status.value,
                    row.reason,
                    row.input_digest,
                    row.created_at,
                    row.updated_at,
                ),
            )
            for e in memory.load_events(run_id):
                conn.execute(
                    "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, NULL, ?)",
                    (
                        e.run_id,
                        e.seq,
                        e.type.value,
                        e.key,
                        encode(e.payload, what="golden"),
                        e.value_json,
                        e.created_at,
                    ),
                )
        conn.commit()
        conn.execute("PRAGMA journal_mode=DELETE")


def current(path: Path) -> None:
    for stale in path.parent.glob(path.name + "*"):
        stale.unlink()
    url = f"sqlite:///{path}"
    record(url)
    for name in (path, path.with_name(path.name + ".witness")):
        with contextlib.closing(sqlite3.connect(name)) as conn:
            conn.execute("PRAGMA journal_mode=DELETE")  # one self-contained file each


def deltas7(path: Path) -> None:
    """Runs d-done (10 turns) and d-inflight (crashed after its seventh) of
    golden_deltas.py: step results stored as text deltas (schema 7)."""
    import golden_deltas

    for stale in path.parent.glob(path.name + "*"):
        stale.unlink()
    url = f"sqlite:///{path}"
    with cp.Ledger(url) as ledger:
        golden_deltas.register(ledger)
        ledger.run("golden-deltas", run_id="d-done", tag="done", turns=golden_deltas.TURNS)
    crashing = cp.Ledger(url, crash_points=cp.CrashPoints(match="after_commit[step_done:turn6]"))
    try:
        golden_deltas.register(crashing)
        crashing.run(
            "golden-deltas", run_id="d-inflight", tag="inflight", turns=golden_deltas.TURNS
        )
    except cp.SimulatedCrash:
        pass
    finally:
        crashing.close()
    for name in (path, path.with_name(path.name + ".witness")):
        with contextlib.closing(sqlite3.connect(name)) as conn:
            conn.execute("PRAGMA journal_mode=DELETE")  # one self-contained file each


REVIEW_POLICY = cp.Policy(
    "golden-policy-1",
    allow={"notes": "1"},
    identity="golden-bot",
    risk={"notes": "high"},
    approval_required={"high"},
)


def checkpoint_v2(path: Path) -> None:
    """Run g-review (see the module docstring) in a scratch ledger and export it."""
    from golden_changed import golden as changed
    from golden_flows import golden as original

    from crashproof.integrity.signing import generate_keypair

    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/review.db"
        options = cp.RunOptions(
            policy=REVIEW_POLICY, limits=cp.Limits(max_steps=20, max_tokens=1000)
        )
        generate_keypair(Path(scratch) / "approver.pem")
        with cp.Ledger(url) as ledger:
            ledger.register_policy(REVIEW_POLICY)
            try:
                ledger.run(original, run_id="g-review", topic="reviews", options=options)
            except cp.RunFrozen:
                pass
            else:
                raise SystemExit("g-review did not wait for its approval")
            public = (Path(scratch) / "approver.pem.pub").read_text()
            ledger.add_approver("golden-approver", public, by="make_golden")
            ledger.approve(
                "g-review", "note", key=Path(scratch) / "approver.pem", by="golden-approver"
            )
            ledger.register(changed)
            try:
                ledger.resume("g-review")
            except cp.RunFrozen:
                pass
            else:
                raise SystemExit("g-review did not freeze on the non-determinism")
            document = ledger.export_run("g-review")
    if not document["run"]["open_review_cases"]:
        raise SystemExit("g-review has no open review case")
    path.write_bytes(serialize(document))


def checkpoint_v3(path: Path) -> None:
    """Run g-moved until a crash after its decision, then export it as a move."""
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/move.db"
        crash_after_decision(url, "g-moved", "moves")
        with cp.Ledger(url) as ledger:
            document = ledger.export_run("g-moved", by="make_golden")
    if document["records"][-1]["type"] != "run_moved":
        raise SystemExit("g-moved was not exported as a move")
    path.write_bytes(serialize(document))


if __name__ == "__main__":
    if sys.argv[1:] == ["current"]:
        current(HERE / "current.db")
        print("current.db written to", HERE)
        raise SystemExit(0)
    if sys.argv[1:] == ["deltas7"]:
        deltas7(HERE / "deltas7.db")
        print("deltas7.db written to", HERE)
        raise SystemExit(0)
    if sys.argv[1:] == ["checkpoint_v3"]:
        checkpoint_v3(HERE / "checkpoint_v3.json")
        print("checkpoint_v3.json written to", HERE)
        raise SystemExit(0)
    if sys.argv[1:] == ["checkpoint_v2"]:
        checkpoint_v2(HERE / "checkpoint_v2.json")
        print("checkpoint_v2.json written to", HERE)
        raise SystemExit(0)
    checkpoint_v2(HERE / "checkpoint_v2.json")
    schema1(HERE / "schema1.db")
    schema1(HERE / "schema1_unmappable.db", status_override="paused")
    current(HERE / "current.db")
    print("golden journals written to", HERE)
