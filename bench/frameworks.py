"""A pydantic-ai agent with no durability, with ``CrashproofDurability`` and with
pydantic-ai's own ``DBOSDurability``, side by side: the same agent (a ``FunctionModel``
that waits ``--model-ms`` per request, ``--turns`` requests each calling one plain
function tool, then an answer), one run at a time, SQLite on one disk.

    .venv/bin/python bench/frameworks.py [--turns 10] [--model-ms 5] [--repeats 5]

Reported: milliseconds per agent run (median), the ratio to no durability, and the
overhead per journaled call (model request or tool call) over no durability; then the
throughput of ``--concurrency`` runs at once on one event loop (runs per second, the
median of the batches), where the model's wait overlaps and what is left is the
framework's and the journal's own work. DBOS is
skipped with a message when ``dbos`` is not installed (``pip install --group bench``).
DBOS journals the model requests only (its function tools are not steps), so it does
less work per run than crashproof, which journals the tool calls too. "passthrough
capability" wraps the same two hooks and journals nothing: the floor of a durability
capability's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable

Run = Callable[[int], float]  # run number -> seconds
Batch = Callable[[int, int], float]  # batch number, runs at once -> seconds


def make_agent(turns: int, model_ms: float, capabilities: list[Any]) -> Agent[None, str]:
    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(model_ms / 1000)
        turn = sum(1 for m in messages if m.kind == "response")
        if turn < turns:
            return ModelResponse(parts=[ToolCallPart("add", {"x": turn})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="bench", capabilities=capabilities)

    @agent.tool_plain
    def add(x: int) -> int:
        return x + 1

    return agent


class Passthrough(AbstractCapability[None]):
    """A capability that wraps the two hooks crashproof journals and does nothing else:
    the floor of any durability capability's cost (pydantic-ai's own work for it)."""

    async def wrap_model_request(
        self, ctx: Any, *, request_context: Any, handler: Any
    ) -> ModelResponse:
        return await handler(request_context)  # type: ignore[no-any-return]

    async def wrap_tool_execute(
        self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        return await handler(args)


def plain(
    turns: int, model_ms: float, directory: Path, capabilities: list[Any] | None = None
) -> tuple[Run, Batch]:
    agent = make_agent(turns, model_ms, capabilities or [])

    def run(i: int) -> float:
        start = time.perf_counter()
        asyncio.run(agent.run("go"))
        return time.perf_counter() - start

    async def many(n: int) -> None:
        await asyncio.gather(*(agent.run("go") for _ in range(n)))

    def batch(i: int, n: int) -> float:
        start = time.perf_counter()
        asyncio.run(many(n))
        return time.perf_counter() - start

    return run, batch


def crashproof(turns: int, model_ms: float, directory: Path, durability: str) -> tuple[Run, Batch]:
    agent = make_agent(turns, model_ms, [CrashproofDurability()])
    ledger = cp.Ledger(f"sqlite:///{directory}/crashproof-{durability}.db", durability=durability)

    @ledger.workflow("bench", version="1")
    async def flow(ctx: cp.AsyncContext, i: int) -> str:
        with durable(ctx):
            return (await agent.run("go")).output

    def run(i: int) -> float:
        start = time.perf_counter()
        asyncio.run(ledger.run_async(flow, run_id=f"run-{i}", i=i))
        return time.perf_counter() - start

    async def many(i: int, n: int) -> None:
        await asyncio.gather(
            *(ledger.run_async(flow, run_id=f"batch-{i}-{k}", i=k) for k in range(n))
        )

    def batch(i: int, n: int) -> float:
        start = time.perf_counter()
        asyncio.run(many(i, n))
        return time.perf_counter() - start

    return run, batch


def dbos(turns: int, model_ms: float, directory: Path) -> tuple[Run, Batch] | str:
    try:
        version = importlib.metadata.version("dbos")
    except importlib.metadata.PackageNotFoundError:
        return "dbos is not installed"
    from dbos import DBOS, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    DBOS(
        config={
            "name": "crashproof-frameworks",
            "system_database_url": f"sqlite:///{directory}/dbos.db",
            "log_level": "WARNING",
            "application_version": f"bench-{version}",
        }
    )
    agent = make_agent(turns, model_ms, [DBOSDurability()])

    @DBOS.workflow(name="bench_agent")
    async def flow(i: int) -> str:
        return (await agent.run("go")).output

    DBOS.launch()
    loop = asyncio.new_event_loop()

    def run(i: int) -> float:
        start = time.perf_counter()
        with SetWorkflowID(f"run-{i}"):
            loop.run_until_complete(flow(i))
        return time.perf_counter() - start

    async def one(i: int, k: int) -> str:
        with SetWorkflowID(f"batch-{i}-{k}"):  # the task's own context: its own id
            return await flow(k)

    async def many(i: int, n: int) -> None:
        await asyncio.gather(*(one(i, k) for k in range(n)))

    def batch(i: int, n: int) -> float:
        start = time.perf_counter()
        loop.run_until_complete(many(i, n))
        return time.perf_counter() - start

    return run, batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--model-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32, help="runs at once (0: skip)")
    args = parser.parse_args(argv)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    directory = Path(tempfile.mkdtemp(prefix="crashproof-frameworks-"))
    contestants: dict[str, tuple[Run, Batch] | str] = {
        "no durability": plain(args.turns, args.model_ms, directory),
        "passthrough capability": plain(args.turns, args.model_ms, directory, [Passthrough()]),
        "crashproof (normal)": crashproof(args.turns, args.model_ms, directory, "normal"),
        "crashproof (output)": crashproof(args.turns, args.model_ms, directory, "output"),
        "crashproof (full)": crashproof(args.turns, args.model_ms, directory, "full"),
        "pydantic-ai + DBOS": dbos(args.turns, args.model_ms, directory),
    }
    pairs = {k: v for k, v in contestants.items() if not isinstance(v, str)}
    runs = {k: v[0] for k, v in pairs.items()}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for name, run in runs.items():
        run(-1)  # warm up: imports, first connection
        del name
    for i in range(args.repeats):  # interleaved
        for name, run in runs.items():
            times[name].append(run(i))
    calls = 2 * args.turns + 1  # model requests + tool calls
    base = statistics.median(times["no durability"])
    print(
        f"{args.turns + 1} model requests ({args.model_ms:g} ms each) and {args.turns} "
        f"tool calls per run; median of {args.repeats}; Python {sys.version.split()[0]}"
    )
    print(f"{'':24} {'ms/run':>8} {'x plain':>8} {'ms/call':>8}")
    for name in runs:
        median = statistics.median(times[name])
        extra = (median - base) * 1000 / calls
        print(f"{name:24} {median * 1000:8.1f} {median / base:8.2f} {extra:8.2f}")
    for name, reason in contestants.items():
        if isinstance(reason, str):
            print(f"{name}: skipped ({reason})")
    if args.concurrency > 0:
        throughput(pairs, args.concurrency, args.repeats)
    return 0


def throughput(pairs: dict[str, tuple[Run, Batch]], n: int, repeats: int) -> None:
    """Runs per second with ``n`` runs at once, side by side, batches interleaved."""
    walls: dict[str, list[float]] = {name: [] for name in pairs}
    for i in range(repeats):
        for name, (_, batch) in pairs.items():
            walls[name].append(batch(i, n))
    rates = {name: n / statistics.median(w) for name, w in walls.items()}
    dbos_rate = rates.get("pydantic-ai + DBOS")
    print(f"\n{n} runs at once on one event loop; median of {repeats} batches")
    print(f"{'':24} {'runs/s':>8} {'x plain':>8} {'x DBOS':>8}")
    base = rates["no durability"]
    for name, rate in rates.items():
        vs_dbos = f"{rate / dbos_rate:8.2f}" if dbos_rate else f"{'-':>8}"
        print(f"{name:24} {rate:8.1f} {rate / base:8.2f} {vs_dbos}")


if __name__ == "__main__":
    raise SystemExit(main())
