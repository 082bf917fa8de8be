"""A pydantic-ai agent with no durability, with ``CrashproofDurability`` and with
pydantic-ai's own ``DBOSDurability``, side by side: the same agent (a ``FunctionModel``
that waits ``--model-ms`` per request, ``--turns`` requests each calling one plain
function tool, then an answer), one run at a time, SQLite on one disk.

    .venv/bin/python bench/frameworks.py [--turns 10] [--model-ms 5] [--repeats 5]

Reported: milliseconds per agent run (median), the ratio to no durability, and the
overhead per journaled call (model request or tool call) over no durability. DBOS is
skipped with a message when ``dbos`` is not installed (``pip install -e '.[bench]'``).
DBOS journals the model requests only (its function tools are not steps), so it does
less work per run than crashproof, which journals the tool calls too.
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
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable

Run = Callable[[int], float]  # run number -> seconds


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


def plain(turns: int, model_ms: float, directory: Path) -> Run:
    agent = make_agent(turns, model_ms, [])

    def run(i: int) -> float:
        start = time.perf_counter()
        asyncio.run(agent.run("go"))
        return time.perf_counter() - start

    return run


def crashproof(turns: int, model_ms: float, directory: Path, durability: str) -> Run:
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

    return run


def dbos(turns: int, model_ms: float, directory: Path) -> Run | str:
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

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--model-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    directory = Path(tempfile.mkdtemp(prefix="crashproof-frameworks-"))
    contestants: dict[str, Run | str] = {
        "no durability": plain(args.turns, args.model_ms, directory),
        "crashproof (normal)": crashproof(args.turns, args.model_ms, directory, "normal"),
        "crashproof (output)": crashproof(args.turns, args.model_ms, directory, "output"),
        "crashproof (full)": crashproof(args.turns, args.model_ms, directory, "full"),
        "pydantic-ai + DBOS": dbos(args.turns, args.model_ms, directory),
    }
    runs = {k: v for k, v in contestants.items() if not isinstance(v, str)}
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
    print(f"{'':22} {'ms/run':>8} {'x plain':>8} {'ms/call':>8}")
    for name in runs:
        median = statistics.median(times[name])
        extra = (median - base) * 1000 / calls
        print(f"{name:22} {median * 1000:8.1f} {median / base:8.2f} {extra:8.2f}")
    for name, reason in contestants.items():
        if isinstance(reason, str):
            print(f"{name}: skipped ({reason})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
