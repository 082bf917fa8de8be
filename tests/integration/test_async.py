"""Async workflows: the same core as the sync shell, the same journal, either shell
resuming the other's run; misuse refused with nothing recorded; cancellation as a crash."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.journal.records import Event, EventType

from ._targets import Target, TargetTool
from .http_server import IdempotentServer


class AsyncTargetTool(TargetTool):
    """The same target as ``TargetTool``, reached through ``async def`` methods (a tool
    name and version shared with the sync one: the journal cannot tell them apart)."""

    name: ClassVar[str] = "target"

    async def execute(self, call: cp.Call) -> cp.Receipt:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().execute(call)

    async def lookup(self, call: cp.Call) -> cp.Receipt | None:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().lookup(call)


def _plan(n: int) -> dict[str, Any]:
    return {"files": [f"f{i}.py" for i in range(n)]}


async def _aplan(n: int) -> cp.Decision:
    await asyncio.sleep(0)
    return cp.Decision(_plan(n), model="stub", usage={"total_tokens": 7}, cost=0.01)


def _splan(n: int) -> cp.Decision:
    return cp.Decision(_plan(n), model="stub", usage={"total_tokens": 7}, cost=0.01)


def _count(x: int) -> int:
    return x * 2


async def _acount(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


def sync_flow(tool: cp.Tool) -> cp.Workflow[Any]:
    @cp.workflow("agent", version="1")
    def agent(ctx: cp.Context, n: int) -> dict[str, Any]:
        plan = ctx.decide("plan", _splan, n)
        doubled = [ctx.step("count", _count, i) for i in range(n)]
        made = ctx.act("create", tool, title="t", n=n)
        new = ctx.patched("v2")
        return {"plan": plan, "doubled": doubled, "made": made, "v2": new}

    return agent


def async_flow(tool: cp.Tool) -> cp.Workflow[Any]:
    @cp.workflow("agent", version="1")
    async def agent(ctx: cp.AsyncContext, n: int) -> dict[str, Any]:
        plan = await ctx.decide("plan", _aplan, n)
        doubled = [await ctx.step("count", _acount, i) for i in range(n)]
        made = await ctx.act("create", tool, title="t", n=n)
        new = ctx.patched("v2")
        return {"plan": plan, "doubled": doubled, "made": made, "v2": new}

    return agent


_TIMES = {"started_at", "ended_at", "took_us", "at", "time", "session"}


def shape(events: list[Event]) -> list[tuple[str, str | None, str, str | None]]:
    """The journal without what differs between any two drives: clocks and the session."""
    out = []
    for e in events:
        payload = {k: v for k, v in e.payload.items() if k not in _TIMES}
        if e.type is EventType.RUN_STARTED:
            payload.pop("started_by", None)
        out.append((e.type.value, e.key, json.dumps(payload, sort_keys=True), e.value_json))
    return out


def test_an_async_run_writes_the_sync_runs_journal(tmp_path: Path) -> None:
    target_s, target_a = Target(tmp_path / "s.json"), Target(tmp_path / "a.json")
    with cp.Ledger(f"sqlite:///{tmp_path / 's.db'}") as ls:
        sync_result = ls.run(sync_flow(TargetTool(target_s)), run_id="r", n=3)
        sync_events = ls.journal("r")
    with cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}") as la:
        async_result = asyncio.run(
            la.run_async(async_flow(AsyncTargetTool(target_a)), run_id="r", n=3)
        )
        async_events = la.journal("r")
        # Resumed: answered from the journal, nothing runs again.
        assert asyncio.run(la.resume_async("r")) == async_result
    assert async_result == sync_result
    assert sync_result["doubled"] == [0, 2, 4]
    assert sync_result["v2"] is True
    assert shape(async_events) == shape(sync_events)
    assert target_a.count("executes", "r/create") == 1


@pytest.mark.parametrize("first", ["sync", "async"])
def test_either_shell_resumes_the_others_run_at_every_crash_point(
    tmp_path: Path, first: str
) -> None:
    """A run crashed at each crash point by one shell is finished by the other: the
    same result, one effect, no decision asked twice."""
    reference = cp.CrashPoints()
    target = Target(tmp_path / "ref.json")
    with cp.Ledger(f"sqlite:///{tmp_path / 'ref.db'}", crash_points=reference) as ledger:
        expected = ledger.run(sync_flow(TargetTool(target)), run_id="r", n=2)
    assert len(reference.passed) > 10
    decided = reference.passed.index("after_commit[step_done:plan]") + 1
    for at in range(1, len(reference.passed) + 1):
        target = Target(tmp_path / f"{first}-{at}.json")
        asks = tmp_path / f"asks-{first}-{at}"
        sflow, aflow = _flows(TargetTool(target), AsyncTargetTool(target), asks)
        db = f"sqlite:///{tmp_path / f'{first}-{at}.db'}"
        crashing = cp.Ledger(db, crash_points=cp.CrashPoints(at=at))
        with crashing, pytest.raises(cp.SimulatedCrash):
            _drive(crashing, sflow if first == "sync" else aflow)
        with cp.Ledger(db) as ledger:  # run = start, or resume the same input
            got = _drive(ledger, aflow if first == "sync" else sflow)
            assert got == expected, at
            assert ledger.get_run("r").status is cp.RunStatus.SUCCEEDED
        assert target.count("executes", "r/create") <= 1, at
        assert len(target.state()["records"]) == 1, at
        asked = asks.read_text().count("x")
        # Asked again only when the crash came before the decision's record committed.
        assert asked == (1 if at >= decided else 2 if at > 2 else 1), (at, asked)


def _drive(ledger: cp.Ledger, flow: cp.Workflow[Any]) -> Any:
    if flow.is_async:
        return asyncio.run(ledger.run_async(flow, run_id="r", n=2))
    return ledger.run(flow, run_id="r", n=2)


def _flows(stool: cp.Tool, atool: cp.Tool, asks: Path) -> tuple[cp.Workflow[Any], cp.Workflow[Any]]:
    def ask_s(n: int) -> cp.Decision:
        with asks.open("a") as f:
            f.write("x")
        return _splan(n)

    async def ask_a(n: int) -> cp.Decision:
        return ask_s(n)

    @cp.workflow("agent", version="1")
    def agent_s(ctx: cp.Context, n: int) -> dict[str, Any]:
        plan = ctx.decide("plan", ask_s, n)
        doubled = [ctx.step("count", _count, i) for i in range(n)]
        made = ctx.act("create", stool, title="t", n=n)
        return {"plan": plan, "doubled": doubled, "made": made, "v2": ctx.patched("v2")}

    @cp.workflow("agent", version="1")
    async def agent_a(ctx: cp.AsyncContext, n: int) -> dict[str, Any]:
        plan = await ctx.decide("plan", ask_a, n)
        doubled = [await ctx.step("count", _count, i) for i in range(n)]  # a plain fn: a thread
        made = await ctx.act("create", atool, title="t", n=n)
        return {"plan": plan, "doubled": doubled, "made": made, "v2": ctx.patched("v2")}

    return agent_s, agent_a


def test_a_plain_step_runs_in_a_thread_and_a_sync_tool_too(tmp_path: Path) -> None:
    loop_thread: list[int] = []
    seen: list[int] = []

    def blocking() -> int:
        seen.append(threading.get_ident())
        return 1

    with IdempotentServer(tmp_path / "server.json") as server:
        from .http_child import make_tool

        with make_tool(server.url) as http:

            @cp.workflow("http-agent")
            async def flow(ctx: cp.AsyncContext) -> Any:
                loop_thread.append(threading.get_ident())
                await ctx.step("block", blocking)
                return await ctx.act("post", http, body={"title": "hello"})

            with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
                made = asyncio.run(ledger.run_async(flow, run_id="h"))
        assert server.count("h/post", "POST") == 1
        assert made == server.resource("h/post")
    assert seen
    assert seen[0] != loop_thread[0]


# -- misuse: refused with nothing recorded, the run resumable ------------------------


def test_an_async_step_function_in_a_sync_run_is_refused_before_it_runs(tmp_path: Path) -> None:
    ran: list[str] = []

    async def ask() -> str:
        ran.append("asked")
        return "paid"

    @cp.workflow("w")
    def flow(ctx: cp.Context) -> Any:
        return ctx.decide("ask", ask)

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(cp.AsyncMisuse, match="is async"):
            ledger.run(flow, run_id="r")
        assert ran == []
        assert [e.type for e in ledger.journal("r")] == [EventType.RUN_STARTED]
        assert ledger.get_run("r").status is cp.RunStatus.RUNNING

        @cp.workflow("w")
        def fixed(ctx: cp.Context) -> Any:
            return ctx.decide("ask", lambda: "ok")

        ledger.register(fixed)
        assert ledger.resume("r") == "ok"


def test_a_lambda_returning_a_coroutine_in_a_sync_run_is_refused(tmp_path: Path) -> None:
    async def ask() -> str:
        return "paid"

    @cp.workflow("w")
    def flow(ctx: cp.Context) -> Any:
        return ctx.step("ask", lambda: ask())

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(cp.AsyncMisuse):
            ledger.run(flow, run_id="r")
        assert [e.type for e in ledger.journal("r")] == [EventType.RUN_STARTED]


def test_an_async_tool_in_a_sync_run_is_refused_before_its_intent(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")

    @cp.workflow("w")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("create", AsyncTargetTool(target), title="t")

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(cp.AsyncMisuse, match="async execute/lookup"):
            ledger.run(flow, run_id="r")
        assert [e.type for e in ledger.journal("r")] == [EventType.RUN_STARTED]
    assert target.state()["executes"] == {}


def test_the_wrong_entry_point_starts_nothing(tmp_path: Path) -> None:
    @cp.workflow("a")
    async def aflow(ctx: cp.AsyncContext) -> int:
        return 1

    @cp.workflow("s")
    def sflow(ctx: cp.Context) -> int:
        return 1

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(cp.AsyncMisuse, match="run_async"):
            ledger.run(aflow, run_id="a")
        with pytest.raises(cp.AsyncMisuse, match=r"ledger\.run"):
            asyncio.run(ledger.run_async(sflow, run_id="s"))
        assert ledger.runs() == []
        assert asyncio.run(ledger.run_async(aflow, run_id="a")) == 1
        with pytest.raises(cp.AsyncMisuse, match="resume_async"):
            ledger.resume("a")  # refused before the journal is even read for a drive


def test_ctx_calls_from_spawned_tasks_are_refused(tmp_path: Path) -> None:
    async def slow(x: int) -> int:
        await asyncio.sleep(0.01)
        return x

    @cp.workflow("g")
    async def gathered(ctx: cp.AsyncContext) -> Any:
        return await asyncio.gather(ctx.step("a", slow, 1), ctx.step("b", slow, 2))

    @cp.workflow("t")
    async def tasked(ctx: cp.AsyncContext) -> Any:
        return await asyncio.create_task(ctx.step("a", slow, 1))

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        for flow in (gathered, tasked):
            with pytest.raises(cp.AsyncMisuse, match="workflow's own task"):
                asyncio.run(ledger.run_async(flow, run_id=flow.name))
            assert [e.type for e in ledger.journal(flow.name)] == [EventType.RUN_STARTED]
            assert ledger.get_run(flow.name).status is cp.RunStatus.RUNNING


def test_delegated_lets_other_tasks_call_one_at_a_time(tmp_path: Path) -> None:
    """``ctx.delegated()``: a framework's own tasks may call while the workflow waits
    (pydantic-ai's hooks do), in sequence; two at once are refused, nothing recorded."""

    async def slow(x: int) -> int:
        await asyncio.sleep(0.01)
        return x

    @cp.workflow("seq")
    async def sequential(ctx: cp.AsyncContext) -> Any:
        with ctx.delegated():
            a = await asyncio.create_task(ctx.step("a", slow, 1))
            b = await asyncio.create_task(ctx.step("b", slow, 2))
        return [a, b]

    @cp.workflow("par")
    async def parallel(ctx: cp.AsyncContext) -> Any:
        with ctx.delegated():
            return await asyncio.gather(ctx.step("a", slow, 1), ctx.step("b", slow, 2))

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        assert asyncio.run(ledger.run_async(sequential, run_id="seq")) == [1, 2]
        assert [s.key for s in ledger.get_run("seq").steps] == ["a", "b"]
        with pytest.raises(cp.AsyncMisuse, match="while another was in flight"):
            asyncio.run(ledger.run_async(parallel, run_id="par"))
        assert [s.key for s in ledger.get_run("par").steps] == []


def test_a_task_that_outlives_the_drive_records_nothing(tmp_path: Path) -> None:
    late: list[BaseException] = []

    async def main(ledger: cp.Ledger) -> None:
        kept: list[cp.AsyncContext] = []

        @cp.workflow("w")
        async def flow(ctx: cp.AsyncContext) -> int:
            kept.append(ctx)
            return 1

        await ledger.run_async(flow, run_id="r")
        try:
            await kept[0].step("after", _acount, 1)
        except cp.AsyncMisuse as exc:
            late.append(exc)

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        asyncio.run(main(ledger))
        assert "has ended" in str(late[0])
        assert ledger.journal("r")[-1].type is EventType.RUN_SUCCEEDED


# -- cancellation: a crash at that point ------------------------------------------


def test_a_timeout_around_a_step_ends_the_drive_as_a_crash(tmp_path: Path) -> None:
    calls: list[str] = []

    async def slow() -> str:
        calls.append("slow")
        if len(calls) == 1:
            await asyncio.sleep(5)
        return "done"

    @cp.workflow("w")
    async def flow(ctx: cp.AsyncContext) -> Any:
        try:
            async with asyncio.timeout(0.05):
                await ctx.step("slow", slow)
        except TimeoutError:
            pass  # swallowed: the drive still ends here
        return await ctx.step("next", _acount, 1)

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(cp.DriveCancelled, match="'slow'"):
            asyncio.run(ledger.run_async(flow, run_id="r"))
        assert [e.type for e in ledger.journal("r")] == [EventType.RUN_STARTED]
        assert ledger.get_run("r").status is cp.RunStatus.RUNNING

        @cp.workflow("w")
        async def fixed(ctx: cp.AsyncContext) -> Any:
            await ctx.step("slow", slow)
            return await ctx.step("next", _acount, 1)

        ledger.register(fixed)
        assert asyncio.run(ledger.resume_async("r")) == 2  # the same worker takes it back
    assert calls == ["slow", "slow"]


def test_an_act_cancelled_after_execute_began_is_looked_up_on_resume(tmp_path: Path) -> None:
    target = Target(tmp_path / "t.json")
    gate: dict[str, asyncio.Event] = {}

    class SlowAfterCommit(AsyncTargetTool):
        async def execute(self, call: cp.Call) -> cp.Receipt:  # type: ignore[override]
            receipt = TargetTool.execute(self, call)  # committed at the target
            if "hold" in gate:
                await gate["hold"].wait()  # the response never comes back
            return receipt

    tool = SlowAfterCommit(target)

    @cp.workflow("w")
    async def flow(ctx: cp.AsyncContext) -> Any:
        return await ctx.act("create", tool, title="t")

    async def cancelled(ledger: cp.Ledger) -> None:
        gate["hold"] = asyncio.Event()
        task = asyncio.create_task(ledger.run_async(flow, run_id="r"))
        while target.count("executes", "r/create") == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        asyncio.run(cancelled(ledger))
        types = [e.type for e in ledger.journal("r")]
        assert types[-1] is EventType.ACT_INTENT  # intent durable, no receipt: in flight
        gate.clear()
        made = asyncio.run(ledger.resume_async("r"))
    assert made == {"id": "rec-1"}
    assert target.count("executes", "r/create") == 1
    assert target.count("lookups", "r/create") == 1


# -- AsyncHttpTool: HttpTool's protocol on httpx.AsyncClient ------------------------


def _async_http(server: IdempotentServer) -> Any:
    from crashproof.tools.http_async import AsyncHttpTool

    return AsyncHttpTool(server.url, "/resources", lookup_path="/resources/by-key/{operation_id}")


@pytest.mark.parametrize(
    "point", ["inside[act:create:responded]", "before_commit[step_done:create]"]
)
def test_async_http_effect_lost_with_its_response_is_found_by_the_sync_tool(
    tmp_path: Path, point: str
) -> None:
    """Committed at the target, the crash before the receipt: the async drive sent it
    with its key, digest and fencing token; a sync resume (HttpTool) looks it up."""
    from .http_child import make_tool

    with IdempotentServer(tmp_path / "server.json") as server:
        atool = _async_http(server)

        @cp.workflow("post", version="1")
        async def apost(ctx: cp.AsyncContext) -> Any:
            return await ctx.act("create", atool, body={"name": "a"})

        db = f"sqlite:///{tmp_path / 'l.db'}"
        crashing = cp.Ledger(db, crash_points=cp.CrashPoints(match=point))
        with crashing, pytest.raises(cp.SimulatedCrash):
            asyncio.run(crashing.run_async(apost, run_id="r"))
        sent = {k.lower(): v for k, v in server.requests("r/create")[0]["headers"].items()}
        assert sent["idempotency-key"] == '"r/create"'
        assert sent["fencing-token"] == "1"
        assert len(sent["crashproof-intent-digest"]) == 64
        with make_tool(server.url) as stool:

            @cp.workflow("post", version="1")
            def spost(ctx: cp.Context) -> Any:
                return ctx.act("create", stool, body={"name": "a"})

            with cp.Ledger(db) as ledger:
                got = ledger.run(spost, run_id="r")
        assert got == server.resource("r/create")
        assert server.count("r/create", "POST") == 1
        assert server.count("r/create", "GET") >= 1


def test_async_http_key_reused_with_another_intent_freezes(tmp_path: Path) -> None:
    with IdempotentServer(tmp_path / "server.json") as server:
        server.seed("r/create", "0" * 64, {"name": "someone else"})
        atool = _async_http(server)

        @cp.workflow("post", version="1")
        async def apost(ctx: cp.AsyncContext) -> Any:
            return await ctx.act("create", atool, body={"name": "a"})

        with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
            with pytest.raises(cp.RunFrozen) as frozen:
                asyncio.run(ledger.run_async(apost, run_id="r"))
            assert isinstance(frozen.value.cause, cp.ReceiptConflict)
            assert ledger.get_run("r").status is cp.RunStatus.NEEDS_REVIEW


def test_async_drives_on_one_loop_keep_their_leases_renewed_together(tmp_path: Path) -> None:
    # One renewal task for the loop's drives (runtime/driving/leases.py: _Renewals): four
    # runs awaiting past several lease lengths still hold their leases, another ledger
    # cannot claim them meanwhile, and each lease is free once its run ended.
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    blocked: list[str] = []

    @cp.workflow("long-wait")
    async def long_wait(ctx: cp.AsyncContext) -> int:
        return int(await ctx.step("wait", asyncio.sleep, 1.0, 7))

    async def drive(ledger: cp.Ledger, other: cp.Ledger) -> list[int]:
        runs = [
            asyncio.ensure_future(ledger.run_async(long_wait, run_id=f"r{k}")) for k in range(4)
        ]
        await asyncio.sleep(0.8)  # past 2.5 leases of 0.3 s: only renewals keep them
        for k in range(4):
            try:
                await other.resume_async(f"r{k}")
            except cp.LeaseHeld:
                blocked.append(f"r{k}")
        return list(await asyncio.gather(*runs))

    with cp.Ledger(url, lease_seconds=0.3) as ledger, cp.Ledger(url) as other:
        other.register(long_wait)
        assert asyncio.run(drive(ledger, other)) == [7, 7, 7, 7]
        assert blocked == ["r0", "r1", "r2", "r3"]
        assert {info.owner for info in ledger.leases().values()} == {None}
