"""Output-triggered durability on a real SQLite ledger: which commits are forced to disk,
how concurrent runs share those syncs, and that what a sync covers is really there."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.store.sqlite import SQLiteStore
from crashproof.tools.port import Call, Receipt, Tool
from crashproof.verify.powercut import DurableSnapshots, attach

KEY = "ab" * 32


class Noop(Tool):
    """A tool whose effect is nothing: only the act protocol's own cost remains."""

    name = "noop"
    version = "1"
    supports_lookup = False
    idempotent_execute = True

    def execute(self, call: Call) -> Receipt:
        return Receipt(call.operation_id, {"ok": True}, call.intent_digest)


def flow(acts: int, steps: int) -> cp.Workflow[int]:
    @cp.workflow("durability", version="1")
    def run(ctx: cp.Context) -> int:
        for k in range(steps):
            ctx.step(f"step{k}", lambda k=k: k)
            ctx.decide(f"plan{k}", lambda k=k: cp.Decision(f"plan-{k}"))
        for k in range(acts):
            ctx.act(f"act{k}", Noop())
        return acts

    return run


def counting(store: Any) -> list[Path]:
    """A real counter of forced syncs: the store calls it at each one."""
    assert isinstance(store, SQLiteStore)
    calls: list[Path] = []
    store.on_sync.append(calls.append)
    return calls


def test_only_output_points_force_a_sync(tmp_path: Path) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY) as ledger:
        syncs = counting(ledger._store)
        assert ledger.run(flow(acts=0, steps=20), run_id="local") == 0
        assert len(syncs) == 1  # 40 steps and decisions: only the outcome was forced
        assert ledger.run(flow(acts=5, steps=3), run_id="acts") == 5
        assert len(syncs) == 1 + 5 + 1  # one per act's intent, one for the outcome
        assert ledger.run(flow(acts=5, steps=3), run_id="acts") == 5  # delivered again
        assert len(syncs) == 1 + 5 + 1 + 1  # the outcome leaves again: synced first


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_other_modes_never_force_a_sync_of_their_own(tmp_path: Path, durability: str) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with cp.Ledger(url, key=KEY, durability=durability) as ledger:
        syncs = counting(ledger._store)
        assert ledger.run(flow(acts=3, steps=2), run_id="r") == 3
        assert syncs == []  # "full": SQLite synced every commit; "normal": never


def test_a_forced_sync_covers_the_record_and_everything_before(tmp_path: Path) -> None:
    """What a power cut would leave (the files as of the last forced sync) holds every
    record up to the output point, and nothing committed after it."""
    path = tmp_path / "l.db"
    snapshots = DurableSnapshots(path, tmp_path / "durable")

    def cut_at(point: str) -> list[str | None]:
        ledger = cp.Ledger(f"sqlite:///{path}", key=KEY, crash_points=cp.CrashPoints(match=point))
        snapshots.attach(ledger._store)  # type: ignore[arg-type]
        with pytest.raises(cp.SimulatedCrash):
            ledger.run(flow(acts=2, steps=2), run_id="r")
        ledger.close()
        snapshots.restore()  # the power comes back
        if not path.exists():
            return []
        with sqlite3.connect(path) as conn:
            kept = [r[0] for r in conn.execute("SELECT key FROM events ORDER BY seq")]
        conn.close()
        return kept

    # No output point yet: a power cut leaves nothing (local steps are simply redone).
    assert cut_at("after_commit[step_done:step1]") == []
    assert snapshots.taken == 0
    # The receipt of act0 is committed, unsynced: the cut keeps up to act0's intent.
    assert cut_at("after_commit[step_done:act0]") == [
        None, "step0", "plan0", "step1", "plan1", "act0"
    ]  # fmt: skip
    # The witness (not restored: the adversarial case) advanced after that sync, to
    # exactly what it made durable, never beyond: resume accepts the journal.
    with contextlib.closing(sqlite3.connect(tmp_path / "l.db.witness")) as witness:
        assert witness.execute("SELECT generation FROM witness").fetchone() == (6,)
    with cp.Ledger(f"sqlite:///{path}", key=KEY) as again:
        assert again.run(flow(acts=2, steps=2), run_id="r") == 2


def test_concurrent_runs_share_forced_syncs(tmp_path: Path) -> None:
    """Group commit: 8 runs in threads of one process reach their acts together; the
    acts' intents share fdatasyncs, and each one returns only once its record is durable
    (in the snapshot taken at the sync that released it)."""
    path = tmp_path / "l.db"
    snapshots = DurableSnapshots(path, tmp_path / "durable")
    runs, acts = 8, 6
    gate = threading.Barrier(runs)
    missing: list[str] = []
    durable: set[tuple[str, str]] = set()  # act intents in the latest snapshot
    guard = threading.Lock()

    def read_snapshot(_database: Path) -> None:
        # Called right after the snapshot is taken, under the store's lock.
        with contextlib.closing(sqlite3.connect(snapshots.directory / "l.db")) as conn:
            rows = conn.execute("SELECT run_id, key FROM events WHERE type = 'act_intent'")
            found = {(run_id, key) for run_id, key in rows}
        with guard:
            durable.clear()
            durable.update(found)

    class Checked(Noop):
        def execute(self, call: Call) -> Receipt:
            with guard:
                if (call.run_id, call.step) not in durable:
                    missing.append(call.operation_id)
            return super().execute(call)

    @cp.workflow("group", version="1")
    def group(ctx: cp.Context) -> int:
        for k in range(acts):
            gate.wait(timeout=30)
            # Each run's own intent: the same intent in two runs at once is held by the
            # first (store/intents.py), and this test is about syncs.
            ctx.act(f"act{k}", Checked(), run=ctx.run_id)
        return acts

    with cp.Ledger(f"sqlite:///{path}", key=KEY) as ledger:
        syncs = counting(ledger._store)
        snapshots.attach(ledger._store)  # type: ignore[arg-type]
        ledger._store.on_sync.append(read_snapshot)  # type: ignore[attr-defined]
        errors: list[BaseException] = []

        def drive(n: int) -> None:
            try:
                ledger.run(group, run_id=f"r{n}")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=drive, args=(n,)) for n in range(runs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        assert missing == []  # every tool executed only after its intent was durable
        outputs = runs * (acts + 1)  # each act's intent, each run's outcome
        assert len(syncs) < outputs, f"{len(syncs)} syncs for {outputs} output points"
        assert ledger._store.syncs == len(syncs)  # type: ignore[attr-defined]


def test_an_outbox_message_is_durable_before_its_delivery(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    snapshots = DurableSnapshots(path, tmp_path / "durable")
    seen: list[int] = []

    def deliver(message: cp.Message) -> str:
        # What a power cut would leave at this instant already holds the message.
        with contextlib.closing(sqlite3.connect(snapshots.directory / "l.db")) as conn:
            seen.append(
                conn.execute(
                    "SELECT count(*) FROM events WHERE key = ? AND type = 'step_done'",
                    (message.step,),
                ).fetchone()[0]
            )
        return "sent"

    outbox = cp.Outbox("mail", deliver)

    @cp.workflow("mail", version="1")
    def mail(ctx: cp.Context) -> str:
        ctx.step("draft", lambda: "hello")
        ctx.act("notify", outbox, text="hello")
        return "done"

    with cp.Ledger(f"sqlite:///{path}", key=KEY) as ledger:
        syncs = counting(ledger._store)
        snapshots.attach(ledger._store)  # type: ignore[arg-type]
        assert ledger.run(mail, run_id="m") == "done"
    assert seen == [1]
    assert len(syncs) == 2  # the message before its delivery, the run's outcome


def test_a_frozen_run_is_durable_before_it_is_reported(tmp_path: Path) -> None:
    class Flaky(Noop):
        idempotent_execute = False

        def execute(self, call: Call) -> Receipt:
            raise TimeoutError("no answer")  # outcome unknown, and no lookup: frozen

    @cp.workflow("frozen", version="1")
    def frozen(ctx: cp.Context) -> None:
        ctx.step("prepare", lambda: 1)
        ctx.act("charge", Flaky())

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", key=KEY) as ledger:
        syncs = counting(ledger._store)
        with pytest.raises(cp.RunFrozen):
            ledger.run(frozen, run_id="f")
        assert len(syncs) == 2  # the act's intent, then the freeze before RunFrozen leaves
        with pytest.raises(cp.RunFrozen):
            ledger.run(frozen, run_id="f")  # reported again from the journal
        assert len(syncs) == 3


def test_concurrent_runs_share_witness_writes_and_act_only_once_witnessed(
    tmp_path: Path,
) -> None:
    """The group sync's leader advances the witness once for every run its sync covered,
    before any of them goes on: each tool executes only once the witness holds its intent,
    and the runs write the witness fewer times than they pass output points."""
    path = tmp_path / "l.db"
    runs, acts = 8, 6
    gate = threading.Barrier(runs)
    unwitnessed: list[str] = []
    journal_seq: dict[str, int] = {}

    class Checked(Noop):
        def execute(self, call: Call) -> Receipt:
            with contextlib.closing(sqlite3.connect(f"{path}.witness")) as conn:
                row = conn.execute(
                    "SELECT generation FROM witness WHERE run_id = ?", (call.run_id,)
                ).fetchone()
            with contextlib.closing(sqlite3.connect(path)) as conn:
                (intent_seq,) = conn.execute(
                    "SELECT seq FROM events WHERE run_id = ? AND key = ? AND type = 'act_intent'",
                    (call.run_id, call.step),
                ).fetchone()
            journal_seq[call.operation_id] = intent_seq
            if row is None or row[0] < intent_seq + 1:
                unwitnessed.append(f"{call.operation_id}: witness {row}, intent {intent_seq}")
            return super().execute(call)

    @cp.workflow("witnessed", version="1")
    def witnessed(ctx: cp.Context) -> int:
        for k in range(acts):
            gate.wait(timeout=30)
            # Each run's own intent: the same intent in two runs at once is held by the
            # first (store/intents.py), and this test is about syncs.
            ctx.act(f"act{k}", Checked(), run=ctx.run_id)
        return acts

    with cp.Ledger(f"sqlite:///{path}", key=KEY) as ledger:
        syncs = counting(ledger._store)
        writes: list[str] = []
        witness_conn = ledger._witness._conn  # type: ignore[union-attr]
        witness_conn.set_trace_callback(lambda sql: writes.append(sql.split()[0].upper()))
        errors: list[BaseException] = []

        def drive(n: int) -> None:
            try:
                ledger.run(witnessed, run_id=f"r{n}")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=drive, args=(n,)) for n in range(runs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        witness_conn.set_trace_callback(None)
        assert errors == []
        assert unwitnessed == []
        assert len(journal_seq) == runs * acts
        outputs = runs * (acts + 1)  # each act's intent, each run's outcome
        assert len(syncs) < outputs
        witness_writes = _witness_transactions(writes)
        assert witness_writes < outputs, f"{witness_writes} witness writes, {outputs} outputs"
        for n in range(runs):
            events = ledger._store.load_events(f"r{n}")  # type: ignore[attr-defined]
            assert ledger._witness.get(f"r{n}") == len(events)  # type: ignore[union-attr]


def _witness_transactions(statements: list[str]) -> int:
    """Transactions in a trace of witness statements: each BEGIN ... COMMIT is one, and
    so is each UPDATE or INSERT outside one (autocommit)."""
    count, inside = 0, False
    for statement in statements:
        if statement == "BEGIN":
            count, inside = count + 1, True
        elif statement in ("COMMIT", "ROLLBACK"):
            inside = False
        elif statement in ("UPDATE", "INSERT") and not inside:
            count += 1
    return count


def test_after_a_power_cut_an_older_journal_copy_is_still_refused(tmp_path: Path) -> None:
    """Anti-rollback across a power cut: the witness keeps, as of its own last sync, the
    advance of the last output point, so a journal copy from before it (taken when the
    first act was about to execute) is refused after the cut, and nothing executes."""
    path = tmp_path / "l.db"
    snapshots = DurableSnapshots(path, tmp_path / "durable")
    older = tmp_path / "older"
    executed: list[str] = []

    class Copying(Noop):
        def execute(self, call: Call) -> Receipt:
            executed.append(call.step)
            if not older.exists():  # the ledger as durable at act0's intent
                shutil.copytree(snapshots.directory, older)
            return super().execute(call)

    @cp.workflow("rollback", version="1")
    def two_acts(ctx: cp.Context) -> int:
        ctx.act("act0", Copying())
        ctx.act("act1", Copying())
        return 2

    ledger = cp.Ledger(f"sqlite:///{path}", key=KEY)
    attach(ledger, snapshots)
    assert ledger.run(two_acts, run_id="r") == 2
    ledger.close()
    snapshots.restore()  # the power cut: each file as of its own last sync
    with cp.Ledger(f"sqlite:///{path}", key=KEY) as again:  # the cut alone: all there
        assert again.check() == [("r", None)]
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    for kept in older.iterdir():  # the older copy restored over it
        shutil.copyfile(kept, tmp_path / kept.name)
    with cp.Ledger(f"sqlite:///{path}", key=KEY) as again, pytest.raises(cp.JournalRolledBack):
        again.run(two_acts, run_id="r")
    assert executed == ["act0", "act1"]


def test_many_async_runs_on_one_loop_share_forced_syncs(tmp_path: Path) -> None:
    """Group commit across the runs of one loop (runtime/driving/batching.py): 64 async
    runs whose acts arrive spread over many turns (a little work of their own before
    each) pass far fewer forced syncs and witness writes than output points, and each
    tool still executes only once the witness holds its intent, which the witness
    reaches only after the sync that made the intent durable, and only once the intent
    is in the ledger as of a forced sync (a power cut's view: verify/powercut.py)."""
    path = tmp_path / "l.db"
    snapshots = DurableSnapshots(path, tmp_path / "durable")
    runs, acts = 64, 4
    unwitnessed: list[str] = []
    executed: list[str] = []
    durable: set[tuple[str, str]] = set()  # act intents in the latest sync's snapshot

    def read_snapshot(_database: Path) -> None:
        # Called right after the snapshot is taken, before the fdatasync it stands for.
        with contextlib.closing(sqlite3.connect(snapshots.directory / "l.db")) as conn:
            rows = conn.execute("SELECT run_id, key FROM events WHERE type = 'act_intent'")
            durable.update((run_id, key) for run_id, key in rows)

    class Checked(Noop):
        async def execute(self, call: Call) -> Receipt:  # type: ignore[override]
            if (call.run_id, call.step) not in durable:
                unwitnessed.append(f"{call.operation_id}: executed before its intent's sync")
            with contextlib.closing(sqlite3.connect(f"{path}.witness")) as conn:
                row = conn.execute(
                    "SELECT generation FROM witness WHERE run_id = ?", (call.run_id,)
                ).fetchone()
            with contextlib.closing(sqlite3.connect(path)) as conn:
                (intent_seq,) = conn.execute(
                    "SELECT seq FROM events WHERE run_id = ? AND key = ? AND type = 'act_intent'",
                    (call.run_id, call.step),
                ).fetchone()
            if row is None or row[0] < intent_seq + 1:
                unwitnessed.append(f"{call.operation_id}: witness {row}, intent {intent_seq}")
            executed.append(call.operation_id)
            return Receipt(call.operation_id, {"ok": True}, call.intent_digest)

    async def think(n: int, k: int) -> int:
        await asyncio.sleep((n * 7 + k * 3) % 11 / 1000)  # the runs drift apart
        return k

    @cp.workflow("fanned", version="1")
    async def fanned(ctx: cp.AsyncContext, n: int) -> int:
        for k in range(acts):
            await ctx.step(f"think{k}", think, n, k)
            # Each run's own intent: the same intent in two runs at once is held.
            await ctx.act(f"act{k}", Checked(), run=ctx.run_id)
        return acts

    with cp.Ledger(f"sqlite:///{path}", key=KEY) as ledger:
        syncs = counting(ledger._store)
        snapshots.attach(ledger._store)  # type: ignore[arg-type]
        ledger._store.on_sync.append(read_snapshot)  # type: ignore[attr-defined]
        writes: list[str] = []
        witness_conn = ledger._witness._conn  # type: ignore[union-attr]
        witness_conn.set_trace_callback(lambda sql: writes.append(sql.split()[0].upper()))

        async def all_runs() -> list[Any]:
            return await asyncio.gather(
                *(ledger.run_async(fanned, run_id=f"r{n}", n=n) for n in range(runs))
            )

        results = asyncio.run(all_runs())
        witness_conn.set_trace_callback(None)
        assert results == [acts] * runs
        assert len(executed) == runs * acts
        assert unwitnessed == []
        outputs = runs * (acts + 1)  # each act's intent, each run's outcome
        witness_writes = _witness_transactions(writes)
        print(f"{outputs} output points, {len(syncs)} syncs, {witness_writes} witness writes")
        assert len(syncs) * 8 <= outputs, f"{len(syncs)} syncs for {outputs} output points"
        # About one witness write with each sync, by its leader (plus the runs' starts, and
        # a waiter that reached the sync after its leader had looked): two each before.
        bound = 1.25 * len(syncs) + 2
        assert witness_writes <= bound, f"{witness_writes} writes, {len(syncs)} syncs"
