"""What the store-failure tests share (DESIGN.md §11 invariant 8, #38 part 1): a real
database error injected at the k-th statement the store runs, a small deterministic
agent (steps, a decision, two acts on a target that dedupes and can be looked up), and
the checks that a failed commit left each run's journal a prefix of the run without
faults and that a resume finishes it with one effect per operation id.

The faults are the databases' own, never a stand-in for crashproof's code:

- SQLite: the store's write connection counts the statements it executes (its trace
  callback, which sees BEGIN, each INSERT/UPDATE, COMMIT and the statements of
  triggers) and SQLite's progress handler interrupts the k-th (``SQLITE_INTERRUPT``:
  "interrupted", the statement undone; a COMMIT interrupted leaves the transaction
  open, which the store rolls back);
- PostgreSQL: triggers on the ledger's tables count every statement that writes them
  (and, deferred to COMMIT, every record a transaction inserted); the k-th terminates
  its own backend (``pg_terminate_backend(pg_backend_pid())``): the client sees the
  connection lost mid-statement or mid-COMMIT, as in a server crash.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import crashproof as cp

Shape = tuple[str, str | None, str | None]  # a record's type, key and step status


class Book(cp.Tool):
    """A target that dedupes by operation id and can be looked up (a payment ledger
    elsewhere): ``effects`` counts what really happened, per operation id."""

    name: ClassVar[str] = "book"
    version: ClassVar[str] = "1"

    def __init__(self) -> None:
        self.effects: Counter[str] = Counter()
        self.entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def execute(self, call: cp.Call) -> cp.Receipt:
        with self._lock:
            self.effects[call.operation_id] += 1
            entry = self.entries.setdefault(call.operation_id, {"params": call.params})
        return cp.Receipt(call.operation_id, entry, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        with self._lock:
            entry = self.entries.get(call.operation_id)
        return None if entry is None else cp.Receipt(call.operation_id, entry, call.intent_digest)


class Agent:
    """The agent, in both shells: read, decide, pay, check, notify; like many agents it
    falls back when a call raises (``except Exception``), which must not let it go on
    past the ledger's failure. ``asked`` counts the decisions put to the "model"."""

    def __init__(
        self,
        ledger: cp.Ledger,
        book: Book,
        pause: float = 0.0,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """``pause``: seconds each step takes; ``tick``: called as each step runs (what a
        crash test times its crash by)."""
        self.book = book
        self.asked: Counter[str] = Counter()

        def read(n: int) -> dict[str, int]:
            if tick is not None:
                tick()
            time.sleep(pause)
            return {"n": n, "items": n * 3}

        def ask(run: str, seen: dict[str, int]) -> cp.Decision:
            self.asked[run] += 1
            return cp.Decision(f"pay {seen['items']}", model="m", usage={"input_tokens": 3})

        def check(receipt: dict[str, Any]) -> bool:
            if tick is not None:
                tick()
            time.sleep(pause)
            return bool(receipt["params"])

        @ledger.workflow("agent", version="1")
        def agent(ctx: cp.Context, n: int) -> list[Any]:
            seen = ctx.step("read", read, n)
            try:  # an agent's own fallback: it must not swallow the ledger's failure
                plan = ctx.decide("plan", ask, ctx.run_id, seen)
            except Exception:
                plan = "fallback"
            try:
                paid = ctx.act("pay", book, amount=seen["items"], memo=plan, to=ctx.run_id)
            except Exception:
                paid = {"params": {"amount": 0}}
            try:
                ok = ctx.step("check", check, paid)
            except Exception:
                ok = False
            sent = ctx.act("notify", book, text=f"{plan}: {ok}", to=ctx.run_id)
            return [seen, plan, paid["params"]["amount"], ok, sent["params"]["text"]]

        @ledger.workflow("agent_async", version="1")
        async def agent_async(ctx: cp.AsyncContext, n: int) -> list[Any]:
            seen = await ctx.step("read", read, n)
            try:
                plan = await ctx.decide("plan", ask, ctx.run_id, seen)
            except Exception:
                plan = "fallback"
            try:
                paid = await ctx.act("pay", book, amount=seen["items"], memo=plan, to=ctx.run_id)
            except Exception:
                paid = {"params": {"amount": 0}}
            try:
                ok = await ctx.step("check", check, paid)
            except Exception:
                ok = False
            sent = await ctx.act("notify", book, text=f"{plan}: {ok}", to=ctx.run_id)
            return [seen, plan, paid["params"]["amount"], ok, sent["params"]["text"]]

        self.sync = agent
        self.async_ = agent_async


def run_all(ledger: cp.Ledger, agent: Agent, shell: str, runs: list[str]) -> dict[str, Any]:
    """Drive ``runs`` (started, or resumed where they exist): each one's result, or the
    exception its drive raised. The async shell drives them together on one loop, so
    that their commits share batches; the sync shell in a thread each."""
    if shell == "sync":  # several runs: a thread each, as a threaded server drives them

        def one(run: str) -> Any:
            try:
                return ledger.run(agent.sync, run_id=run, n=2)
            except Exception as exc:
                return exc

        with ThreadPoolExecutor(max_workers=len(runs)) as pool:
            return dict(zip(runs, pool.map(one, runs), strict=True))

    async def all_of() -> list[Any]:
        return await asyncio.gather(
            *(ledger.run_async(agent.async_, run_id=run, n=2) for run in runs),
            return_exceptions=True,
        )

    return dict(zip(runs, asyncio.run(all_of()), strict=True))


def shape(ledger: cp.Ledger, run: str) -> list[Shape]:
    """The run's journal as (type, key, status): what a prefix is judged on (its
    payloads carry times and sessions that differ between drives)."""
    if ledger.store.get_run(run) is None:  # its start failed
        return []
    events = ledger.journal(run)
    return [(e.type.value, e.key, (e.payload or {}).get("status")) for e in events]


def check_prefix(got: list[Shape], clean: list[Shape], run: str, k: int) -> None:
    """No record committed after a failed one: what a failed drive left is exactly a
    prefix of the run without faults (a record lost, then a later one kept, would show
    as the later one in the lost one's place; a store error journaled as a call's
    failure, as a failed status)."""
    if got != clean[: len(got)]:
        at = next(i for i, (g, c) in enumerate(zip(got, clean, strict=False)) if g != c)
        raise AssertionError(
            f"fault at statement {k}: run {run!r} is no prefix of the clean run at record "
            f"{at}: {got[at]} where the clean run has {clean[at]}\n got: {got}\n clean: {clean}"
        )


def check_finished(
    ledger: cp.Ledger, agent: Agent, results: dict[str, Any], clean_result: Callable[[str], Any]
) -> None:
    """Every run succeeded with the clean run's result, each act's effect happened once,
    and no call was recorded twice."""
    for run, result in results.items():
        if isinstance(result, BaseException):
            raise AssertionError(f"run {run!r} did not finish on resume: {result!r}")
        assert result == clean_result(run), run
        assert ledger.get_run(run).status == cp.RunStatus.SUCCEEDED
        done = [e.key for e in ledger.journal(run) if e.type.value == "step_done"]
        assert len(done) == len(set(done)), f"run {run!r} recorded a call twice: {done}"
        frozen = [e for e in ledger.journal(run) if e.type.value == "run_frozen"]
        assert not frozen, f"run {run!r} was frozen: {frozen[0].payload}"
        for act in ("pay", "notify"):
            assert agent.book.effects[f"{run}/{act}"] == 1, (run, act, agent.book.effects)


class SqliteFault:
    """Interrupts the k-th statement the SQLite store's write connection executes
    (``at``; 0: none, only counted). ``fired``: the statement it interrupted."""

    def __init__(self, store: Any) -> None:
        conn: sqlite3.Connection = store._conn  # the store's one write connection
        self.at = 0
        self.count = 0
        self.fired: str | None = None
        self._armed = False
        conn.set_trace_callback(self._trace)
        conn.set_progress_handler(self._progress, 1)

    def arm(self, at: int) -> None:
        self.at, self.count, self.fired, self._armed = at, 0, None, False

    def _trace(self, sql: str) -> None:
        self.count += 1
        self._armed = self.count == self.at
        if self._armed:
            self.fired = sql

    def _progress(self) -> int:
        if self._armed:
            self._armed = False
            return 1  # SQLITE_INTERRUPT
        return 0


_PG_TICK = """
CREATE OR REPLACE FUNCTION public.fault_tick() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    target bigint;
BEGIN
    SELECT at INTO target FROM public.fault_at;
    IF nextval('public.fault_seq') = target THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(10);  -- the signal lands at the sleep's first interrupt check
    END IF;
    RETURN NULL;
END
$$
"""


class PostgresFault:
    """Terminates the store's backend at the k-th write statement (or deferred record
    check at COMMIT) on the ledger's tables of the database at ``url`` (``at``; 0: none,
    only counted: ``count()``)."""

    def __init__(self, server: Any, url: str, schema: str = "crashproof") -> None:
        self._server = server
        self._url = url
        q = self._query
        q("CREATE SEQUENCE IF NOT EXISTS public.fault_seq")
        q("CREATE TABLE IF NOT EXISTS public.fault_at (at bigint)")
        q("INSERT INTO public.fault_at VALUES (0)")
        q(_PG_TICK)
        for table in ("events", "runs", "blobs", "unresolved_intents"):
            q(
                f"CREATE TRIGGER fault_{table} AFTER INSERT OR UPDATE OR DELETE ON "
                f"{schema}.{table} FOR EACH STATEMENT EXECUTE FUNCTION public.fault_tick()"
            )
        q(
            f"CREATE CONSTRAINT TRIGGER fault_commit AFTER INSERT ON {schema}.events "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.fault_tick()"
        )

    def _query(self, sql: str) -> list[tuple[object, ...]]:
        rows: list[tuple[object, ...]] = self._server.query(self._url, sql)
        return rows

    def arm(self, at: int) -> None:
        self._query(f"UPDATE public.fault_at SET at = {int(at)}")
        self._query("SELECT setval('public.fault_seq', 1, false)")

    def count(self) -> int:
        """The points passed since ``arm``."""
        (row,) = self._query("SELECT last_value, is_called FROM public.fault_seq")
        return int(row[0]) if row[1] else 0  # type: ignore[call-overload]
