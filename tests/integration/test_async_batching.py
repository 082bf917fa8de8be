"""Async drives that commit in the same turn of their loop share one transaction
(runtime/driving/batching.py): each run still writes the sync run's journal, a record
refused in a batch costs the other runs nothing, and a crash inside a batch resumes
like a crash at that record of one run."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import Event

from ._targets import Target, TargetTool
from .test_async import AsyncTargetTool, _acount, _aplan, _count, _splan, shape

RUNS = 12


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ledger of the batched drives: both stores commit a batch in one transaction
    (SQLiteStore.write_batch, PostgresBatchAppend.append_batch)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'a.db'}"


class _Batches:
    """Counts the items of every call of the ledger's store's ``method`` (it calls
    through): the groups of a commit batch, the runs of a start batch. A commit batch is
    ``write_batch`` where the store has it (SQLite: the loop writes, a thread waits for
    the disk), else ``append_batch``."""

    def __init__(self, ledger: cp.Ledger, method: str = "commit batch") -> None:
        store = ledger._store
        if method == "commit batch":
            method = "write_batch" if hasattr(store, "write_batch") else "append_batch"
        self.sizes: list[int] = []
        inner = getattr(store, method)

        def counted(items: Any) -> Any:
            self.sizes.append(len(items))
            return inner(items)

        setattr(store, method, counted)


# Each run's own act (title: the run id): identical intents of concurrent runs would
# wait on each other (an unresolved intent is held across runs: runtime/steps/holds.py).


def sync_flow(tool: cp.Tool) -> cp.Workflow[Any]:
    @cp.workflow("agent", version="1")
    def agent(ctx: cp.Context, n: int) -> dict[str, Any]:
        plan = ctx.decide("plan", _splan, n)
        doubled = [ctx.step("count", _count, i) for i in range(n)]
        made = ctx.act("create", tool, title=ctx.run_id, n=n)
        return {"plan": plan, "doubled": doubled, "made": made}

    return agent


def async_flow(tool: cp.Tool) -> cp.Workflow[Any]:
    barrier = asyncio.Barrier(RUNS) if hasattr(asyncio, "Barrier") else None

    async def count(x: int) -> int:
        # The drives leave each step together: their commits meet in the same turn.
        if barrier is not None:
            await barrier.wait()
        return await _acount(x)

    @cp.workflow("agent", version="1")
    async def agent(ctx: cp.AsyncContext, n: int) -> dict[str, Any]:
        plan = await ctx.decide("plan", _aplan, n)
        doubled = [await ctx.step("count", count, i) for i in range(n)]
        made = await ctx.act("create", tool, title=ctx.run_id, n=n)
        return {"plan": plan, "doubled": doubled, "made": made}

    return agent


def _unordered(events: list[Event]) -> list[Any]:
    """The journal's shape, the act's receipt masked (and the result that holds it): the
    target numbers its records in the order the runs reach it."""
    return [
        (*rec[:2], "receipt") if rec[1] == "create" or rec[0] == "run_succeeded" else rec
        for rec in shape(events)
    ]


async def _all(ledger: cp.Ledger, flow: cp.Workflow[Any], ids: list[str]) -> list[Any]:
    return await asyncio.gather(*(ledger.run_async(flow, run_id=i, n=3) for i in ids))


def test_concurrent_drives_commit_together_and_each_writes_the_sync_journal(
    tmp_path: Path, url: str
) -> None:
    ids = [f"r{k}" for k in range(RUNS)]
    target_s, target_a = Target(tmp_path / "s.json"), Target(tmp_path / "a.json")
    with cp.Ledger(f"sqlite:///{tmp_path / 's.db'}") as ls:
        flow = sync_flow(TargetTool(target_s))
        expected = [ls.run(flow, run_id=i, n=3) for i in ids]
        sync_journals = {i: _unordered(ls.journal(i)) for i in ids}
    with cp.Ledger(url) as la:
        batches = _Batches(la)
        results = asyncio.run(_all(la, async_flow(AsyncTargetTool(target_a)), ids))
        async_journals = {i: _unordered(la.journal(i)) for i in ids}
    assert [{**r, "made": None} for r in results] == [{**r, "made": None} for r in expected]
    assert async_journals == sync_journals
    # The drives step in lockstep: their commits met in shared transactions.
    assert max(batches.sizes) > 1, batches.sizes
    assert all(target_a.count("executes", f"{i}/create") == 1 for i in ids)


def _next(event: Event, seq: int) -> Event:
    """A record that continues a journal: ``event`` again at ``seq``."""
    return Event(event.run_id, seq, event.type, event.key, event.payload, event.created_at)


def test_a_record_refused_in_a_batch_keeps_the_other_runs_records(tmp_path: Path, url: str) -> None:
    flow = sync_flow(TargetTool(Target(tmp_path / "t.json")))
    with cp.Ledger(url) as ledger:
        for run_id in ("a", "b", "c"):
            ledger.run(flow, run_id=run_id, n=1)
        ends = {r: ledger.journal(r) for r in ("a", "b", "c")}
        token = {r: ledger.leases()[r].token for r in ("a", "b", "c")}
        a, b, c = (ends[r][-1] for r in ("a", "b", "c"))
        na, nb, nc = (len(ends[r]) for r in ("a", "b", "c"))
        results = ledger.commit_batch(
            [
                [((_next(a, na),), None, token["a"], False)],
                [((_next(b, nb),), None, token["b"] + 7, False)],  # a superseded lease
                [
                    ((_next(c, nc),), None, token["c"], False),
                    ((_next(c, nc + 2),), None, token["c"], False),  # a gap
                ],
            ]
        )
        assert results[0] is None
        assert results[1] is not None
        assert results[1][0] == 0
        assert isinstance(results[1][1], cp.StaleLeaseError)
        assert results[2] is not None
        assert results[2][0] == 1
        # A gap under the run's own current lease: the journal is not where its drive's
        # commits left it, the ledger's failure (#38), not another writer.
        assert isinstance(results[2][1], cp.LedgerError)
        # Kept exactly what was not refused, every chain intact (journal verifies it).
        assert len(ledger.journal("a")) == na + 1
        assert len(ledger.journal("b")) == nb
        assert len(ledger.journal("c")) == nc + 1


def test_a_record_refused_after_writing_part_of_itself_keeps_nothing_of_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch writes longer records without savepoints; one refused after it wrote (an
    act's intent: its hold in the index of intents, then an INSERT that fails) has the
    transaction done again with them, so its hold is undone and the others are kept."""
    from crashproof.store import sqlite_journal

    flow = sync_flow(TargetTool(Target(tmp_path / "t.json")))
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        for run_id in ("a", "b"):
            ledger.run(flow, run_id=run_id, n=1)
        a, b = ledger.journal("a"), ledger.journal("b")
        token = {r: ledger.leases()[r].token for r in ("a", "b")}
        intent = next(e for e in b if e.type.value == "act_intent")
        inner, tries = sqlite_journal.insert_record, []

        def failing(conn: Any, run_id: str, *args: Any) -> None:
            if run_id == "b":
                tries.append(run_id)
                raise sqlite3.IntegrityError("UNIQUE constraint failed: events.id")
            inner(conn, run_id, *args)

        monkeypatch.setattr(sqlite_journal, "insert_record", failing)
        results = ledger.commit_batch(
            [
                [((_next(a[-1], len(a)),), None, token["a"], False)],
                [((_next(intent, len(b)),), None, token["b"], True)],
            ]
        )
        monkeypatch.undo()
        assert results[0] is None
        assert results[1] is not None
        assert isinstance(results[1][1], cp.StaleLeaseError)
        assert len(tries) == 2  # written without savepoints, then again with them
        assert len(ledger.journal("a")) == len(a) + 1
        assert len(ledger.journal("b")) == len(b)
    with sqlite3.connect(tmp_path / "l.db") as conn:
        held = conn.execute("SELECT run_id FROM unresolved_intents").fetchall()
    assert held == []  # the refused intent's hold was undone with it


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_a_crash_inside_a_batch_resumes_every_run_once(
    tmp_path: Path, point: str, url: str
) -> None:
    ids = [f"r{k}" for k in range(RUNS)]
    target = Target(tmp_path / "t.json")
    flow = async_flow(AsyncTargetTool(target))
    # The third commit of the counting steps: by then the drives commit in batches.
    crash = cp.CrashPoints(match=f"{point}[step_done:count#2]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        batches = _Batches(ledger)
        with pytest.raises(cp.SimulatedCrash):
            asyncio.run(_all(ledger, flow, ids))
    assert crash.fired is not None
    assert max(batches.sizes) > 1
    with cp.Ledger(f"sqlite:///{tmp_path / 'fresh.db'}") as fresh:
        clean_flow = sync_flow(TargetTool(Target(tmp_path / "u.json")))
        clean = [fresh.run(clean_flow, run_id=i, n=3) for i in ids]
    with cp.Ledger(url) as ledger:
        ledger.register(sync_flow(TargetTool(target)))  # either shell resumes the other's
        resumed = [ledger.resume(i) for i in ids]
        assert [{**r, "made": None} for r in resumed] == [{**r, "made": None} for r in clean]
        for i in ids:
            assert shape(ledger.journal(i))[-1][0] == "run_succeeded"
            assert target.count("executes", f"{i}/create") == 1


def plain_flow(tool: cp.Tool) -> cp.Workflow[Any]:
    """``async_flow`` without its barrier (any number of runs)."""

    @cp.workflow("agent", version="1")
    async def agent(ctx: cp.AsyncContext, n: int) -> dict[str, Any]:
        plan = await ctx.decide("plan", _aplan, n)
        doubled = [await ctx.step("count", _acount, i) for i in range(n)]
        made = await ctx.act("create", tool, title=ctx.run_id, n=n)
        return {"plan": plan, "doubled": doubled, "made": made}

    return agent


def test_runs_started_in_one_turn_share_one_start_and_a_refused_one_costs_the_others_nothing(
    tmp_path: Path,
) -> None:
    # The starts of one turn of the loop are recorded together (StartBatch, one witness
    # write and one transaction); a start another input conflicts with, and a second
    # drive of a run this ledger drives already, are refused alone.
    target = Target(tmp_path / "t.json")
    flow = plain_flow(AsyncTargetTool(target))
    with cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}") as ledger:
        asyncio.run(ledger.run_async(flow, run_id="taken", n=1))
        starts = _Batches(ledger, "create_runs")

        async def all_at_once() -> list[Any]:
            runs = [ledger.run_async(flow, run_id=f"r{k}", n=2) for k in range(6)]
            runs.append(ledger.run_async(flow, run_id="taken", n=5))  # another input
            runs.append(ledger.run_async(flow, run_id="r0", n=2))  # driven here already
            return await asyncio.gather(*runs, return_exceptions=True)

        results = asyncio.run(all_at_once())
        assert starts.sizes == [6], starts.sizes  # the six new runs, one transaction
        assert all(isinstance(r, dict) for r in results[:6]), results
        assert isinstance(results[6], cp.RunConflict)
        assert isinstance(results[7], cp.LeaseHeld)
        for k in range(6):
            assert ledger.get_run(f"r{k}").status is cp.RunStatus.SUCCEEDED
            assert target.count("executes", f"r{k}/create") == 1
        assert ledger.leases()["taken"].owner is None  # the refused start took nothing


def test_a_run_whose_drive_is_cancelled_while_it_starts_is_resumed_by_the_same_ledger(
    tmp_path: Path,
) -> None:
    target = Target(tmp_path / "t.json")
    flow = plain_flow(AsyncTargetTool(target))
    with cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}") as ledger:

        async def cancelled_at_its_start() -> None:
            task = asyncio.ensure_future(ledger.run_async(flow, run_id="r", n=2))
            await asyncio.sleep(0)  # the task submitted its start; the batch runs next
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled_at_its_start())
        assert ledger.get_run("r") is not None  # started, held by this ledger's worker
        resumed = asyncio.run(ledger.resume_async("r"))  # taken over: abandoned here
        assert resumed["doubled"] == [0, 2]
        assert target.count("executes", "r/create") == 1


@pytest.mark.parametrize("name", ["plan\x00", "plan\udcff"], ids=["NUL", "lone surrogate"])
def test_a_step_name_no_ledger_can_store_is_refused_at_the_call_and_costs_the_others_nothing(
    url: str, name: str
) -> None:
    # Three drives decide together (their records meet in one batch). b's decision is
    # named with a NUL (PostgreSQL's text holds none; SQLite took it) or a lone surrogate
    # (no UTF-8): refused at its call on every store, before any record, with what to do;
    # a's and c's decisions are kept and their runs succeed.
    barrier = asyncio.Barrier(3) if hasattr(asyncio, "Barrier") else None

    async def plan(n: int) -> cp.Decision:
        if barrier is not None:
            await barrier.wait()
        return cp.Decision({"n": n}, model="stub", usage={"total_tokens": 1})

    async def stub(n: int) -> cp.Decision:
        return cp.Decision({"n": n}, model="stub", usage={"total_tokens": 1})

    @cp.workflow("named", version="1")
    async def named(ctx: cp.AsyncContext, n: int) -> Any:
        if ctx.run_id == "b":
            await asyncio.sleep(0)
            if barrier is not None:
                await barrier.wait()
            return await ctx.decide(name, stub, n)  # (without the fix: recorded with a's)
        return await ctx.decide("plan", plan, n)

    async def all_runs(ledger: cp.Ledger) -> list[Any]:
        runs = (ledger.run_async(named, run_id=r, n=1) for r in ("a", "b", "c"))
        return await asyncio.gather(*runs, return_exceptions=True)

    with cp.Ledger(url) as ledger:
        a, b, c = asyncio.run(all_runs(ledger))
        assert a == c == {"n": 1}
        assert isinstance(b, cp.CrashproofError)
        assert "is not allowed: it holds a NUL character or a lone surrogate" in str(b)
        assert [e.type.value for e in ledger.journal("b")] == ["run_started"]
        assert [e.key for e in ledger.journal("a")] == [None, "plan", None]


@pytest.mark.parametrize("bad", ["b\x00", "b\udcff"], ids=["NUL", "lone surrogate"])
def test_a_run_id_no_ledger_can_store_is_refused_before_its_start_and_costs_the_others_nothing(
    url: str, bad: str
) -> None:
    # Three runs start in one turn (one start batch). A run id with a NUL (PostgreSQL's
    # text holds none; SQLite took it) or a lone surrogate (no UTF-8: SQLite's start
    # batch failed whole, a raw UnicodeEncodeError for all three) is refused before
    # anything is written, on every store, with what to do; the others start and finish.
    @cp.workflow("ids", version="1")
    async def ids(ctx: cp.AsyncContext, n: int) -> int:
        return n

    async def all_runs(ledger: cp.Ledger) -> list[Any]:
        runs = (ledger.run_async(ids, run_id=r, n=1) for r in ("a", bad, "c"))
        return await asyncio.gather(*runs, return_exceptions=True)

    with cp.Ledger(url) as ledger:
        a, b, c = asyncio.run(all_runs(ledger))
        assert a == c == 1
        assert isinstance(b, ValueError)
        assert "holds a NUL character or a lone surrogate" in str(b)
        assert sorted(row.run_id for row in ledger.runs()) == ["a", "c"]


@pytest.mark.parametrize(("name", "version"), [("w\x00", "1"), ("w", "1\udcff")])
def test_a_workflow_name_or_version_no_ledger_can_store_is_refused_when_declared(
    name: str, version: str
) -> None:
    # Every run's row holds both: such a workflow's runs could never start on PostgreSQL
    # (and a lone surrogate failed a SQLite start batch whole). Refused in the code.
    with pytest.raises(ValueError, match="holds a NUL character or a lone surrogate"):
        cp.workflow(name, version=version)(lambda ctx: None)
