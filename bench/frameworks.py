"""A pydantic-ai agent with no durability, with ``CrashproofDurability`` and with
pydantic-ai's own ``DBOSDurability``, side by side: the same agent (a ``FunctionModel``
that waits ``--model-ms`` per request, ``--turns`` requests each calling one function
tool, then an answer), SQLite on one disk.

    .venv/bin/python bench/frameworks.py [--turns 10] [--model-ms 5] [--repeats 5]
        [--concurrency 32,256] [--tools step|effect] [--model function|openai]
        [--no-single] [--only normal,output] [--dir D] [--keep]

``--model openai``: the agent asks pydantic-ai's ``OpenAIChatModel`` on the official
``openai`` client instead, over HTTP to ``examples/_model_server.py`` (the same turns,
after ``--model-ms``) in a child process, so that every contestant carries the SDK's own
work per request, as an agent as deployed does; the server's share of a core is printed
(near 100 % it would be the bottleneck, and the ratios would mean nothing).

Reported: milliseconds per agent run one at a time (median), the ratio to no durability,
and the overhead per journaled call (model request or tool call) over no durability;
then, for each ``--concurrency`` R, the throughput of R runs at once on one event loop
(runs per second, the median of the rounds), where the model's waits overlap and what is
left is the framework's and the journal's own work. Each round runs every contestant
once (interleaved) and prints its load average; ``x plain`` is the median of the rounds'
own ratios to no durability. A lease lost by this live process, or a run that did not
succeed, is counted and fails the run (exit 1). ``--tools effect`` marks the tool an
effect (``functions="effect"``: an act, its intent an output point synced before the
tool runs); ``step`` (the capability's default) journals it as a step. DBOS is skipped
with a message when ``dbos`` is not installed (``pip install --group bench``); it
journals the model requests only (its function tools are not steps). "passthrough
capability" wraps the same two hooks and journals nothing: the floor of a durability
capability's cost. The temporary directory is removed at the end (``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)

from _common import LostLeases, bench_dir, load_average, machine_facts, print_facts
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable

Run = Callable[[int], float]  # run number -> seconds
Batch = Callable[[int, int], tuple[float, int]]  # round, runs at once -> seconds, failed runs


def make_agent(
    turns: int, model_ms: float, capabilities: list[Any], model: Model | None = None
) -> Agent[None, str]:
    """The agent; its tool calls name the run's prompt, so that no two runs ask the same
    effect (an act's intent is held across runs: ``IntentHeld``). Its model is the
    ``FunctionModel`` unless ``model`` is given; ``--model openai`` gives each batch a
    ``Models.new()``."""

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(model_ms / 1000)
        turn = sum(1 for m in messages if m.kind == "response")
        prompt = str(getattr(messages[0].parts[-1], "content", ""))
        if turn < turns:
            return ModelResponse(parts=[ToolCallPart("add", {"x": turn, "run": prompt})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(model or FunctionModel(answer), name="bench", capabilities=capabilities)

    @agent.tool_plain
    def add(x: int, run: str) -> int:
        return x + 1

    return agent


# The model server of ``--model openai``, run in a child process: ``examples/_model_server.py``
# playing ``turns`` tool calls then an answer; each tool call names the run's prompt (the
# first user message), as the function model's do.
_SERVER = """
import json, sys, threading
from http.server import ThreadingHTTPServer
sys.path.insert(0, sys.argv[3])
from examples._model_server import ModelServer

ThreadingHTTPServer.request_queue_size = 1024  # the listen backlog: every run connects at once

class Server(ModelServer):
    def answer(self, body):
        status, payload = super().answer(body)
        prompt = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
        for choice in payload.get("choices", ()):
            for call in choice["message"].get("tool_calls", ()):
                arguments = {**json.loads(call["function"]["arguments"]), "run": prompt}
                call["function"]["arguments"] = json.dumps(arguments)
        return status, payload

turns, delay = int(sys.argv[1]), float(sys.argv[2])
script = [("", [("add", {"x": k})]) for k in range(turns)] + [("done", [])]
print(Server(script, delay=delay).start().url, flush=True)
threading.Event().wait()
"""


class Models:
    """Where each batch's model comes from. ``function``: nowhere (the agent's own
    ``FunctionModel``, in this process). ``openai``: pydantic-ai's ``OpenAIChatModel`` on
    the official ``openai`` client, over HTTP to ``examples/_model_server.py`` in a child
    process, which answers after ``model_ms``. The SDK's own work per request (JSON,
    HTTP, parsing) is then on every contestant's side, as in an agent as deployed, and
    the server's is not in this process. A fresh client per event loop (``new``): its
    connection pool belongs to the loop that opened it."""

    def __init__(self, kind: str, turns: int, model_ms: float) -> None:
        self.kind = kind
        self.url = ""
        self._server: subprocess.Popen[str] | None = None
        if kind == "openai":
            root = str(Path(__file__).resolve().parent.parent)
            self._server = subprocess.Popen(
                [sys.executable, "-c", _SERVER, str(turns), str(model_ms / 1000), root],
                stdout=subprocess.PIPE,
                text=True,
            )
            self.url = (self._server.stdout.readline() if self._server.stdout else "").strip()
            if not self.url:
                self.close()
                raise SystemExit("the model server did not start")

    def new(self) -> Model | None:
        """A model for one event loop's runs (None: the agent's own)."""
        if self.kind != "openai":
            return None
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        client = AsyncOpenAI(base_url=self.url, api_key="bench", max_retries=0)
        return OpenAIChatModel("bench-model", provider=OpenAIProvider(openai_client=client))

    def server_cpu(self) -> float:
        """Seconds of CPU the model server has used (0 without one): a server near one
        core's worth of the wall time would be the bottleneck, and the ratios would mean
        nothing."""
        if self._server is None:
            return 0.0
        fields = Path(f"/proc/{self._server.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self._server is not None:
            self._server.terminate()
            self._server.wait(timeout=10)
            self._server = None


async def _closed(model: Model | None, results: list[Any]) -> list[Any]:
    """``results``, once ``model``'s client (if any) is closed, inside its event loop."""
    client = getattr(model, "client", None)
    if client is not None:
        await client.close()
    return results


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
    turns: int, model_ms: float, models: Models, capabilities: list[Any] | None = None
) -> tuple[Run, Batch]:
    agent = make_agent(turns, model_ms, capabilities or [])

    async def one(prompt: str) -> None:
        model = models.new()
        await _closed(model, [await agent.run(prompt, model=model)])

    def run(i: int) -> float:
        start = time.perf_counter()
        asyncio.run(one(f"run-{i}"))
        return time.perf_counter() - start

    async def many(i: int, n: int) -> list[Any]:
        model = models.new()
        results = await asyncio.gather(
            *(agent.run(f"batch-{i}-{k}", model=model) for k in range(n)),
            return_exceptions=True,
        )
        return await _closed(model, results)

    def batch(i: int, n: int) -> tuple[float, int]:
        start = time.perf_counter()
        results = asyncio.run(many(i, n))
        return time.perf_counter() - start, _failed(results)

    return run, batch


def crashproof(
    turns: int,
    model_ms: float,
    directory: Path,
    durability: str,
    tools: str,
    models: Models,
    closers: list[Callable[[], Any]],
) -> tuple[Run, Batch]:
    functions = "effect" if tools == "effect" else "step"
    agent = make_agent(turns, model_ms, [CrashproofDurability(functions=functions)])
    ledger = cp.Ledger(f"sqlite:///{directory}/crashproof-{durability}.db", durability=durability)
    closers.append(ledger.close)

    model: list[Model | None] = [None]  # this event loop's (the workflow's arguments are JSON)

    @ledger.workflow("bench", version="1")
    async def flow(ctx: cp.AsyncContext, prompt: str) -> str:
        with durable(ctx):
            return (await agent.run(prompt, model=model[0])).output

    async def one(i: int) -> None:
        model[0] = models.new()
        await _closed(
            model[0], [await ledger.run_async(flow, run_id=f"run-{i}", prompt=f"run-{i}")]
        )

    def run(i: int) -> float:
        start = time.perf_counter()
        asyncio.run(one(i))
        return time.perf_counter() - start

    async def many(i: int, n: int) -> list[Any]:
        model[0] = models.new()
        results = await asyncio.gather(
            *(
                ledger.run_async(flow, run_id=f"batch-{n}-{i}-{k}", prompt=f"batch-{n}-{i}-{k}")
                for k in range(n)
            ),
            return_exceptions=True,
        )
        return await _closed(model[0], results)

    def batch(i: int, n: int) -> tuple[float, int]:
        start = time.perf_counter()
        results = asyncio.run(many(i, n))
        return time.perf_counter() - start, _failed(results)

    return run, batch


def _failed(results: list[Any]) -> int:
    """How many runs of a batch raised (each printed once, briefly)."""
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors[:1]:
        print(f"  a run failed: {type(error).__name__}: {error}", file=sys.stderr)
    return len(errors)


def dbos(
    turns: int, model_ms: float, directory: Path, models: Models, closers: list[Callable[[], Any]]
) -> tuple[Run, Batch] | str:
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
    model = models.new()  # one event loop here: one client for every batch
    # DBOS runs only a model registered with it (it cannot carry one across a step)
    durability = DBOSDurability(models={"bench": model} if model else None)
    agent = make_agent(turns, model_ms, [durability], model)

    @DBOS.workflow(name="bench_agent")
    async def flow(prompt: str) -> str:
        return (await agent.run(prompt)).output

    DBOS.launch()
    closers.append(DBOS.destroy)
    loop = asyncio.new_event_loop()
    closers.append(loop.close)

    def run(i: int) -> float:
        start = time.perf_counter()
        with SetWorkflowID(f"run-{i}"):
            loop.run_until_complete(flow(f"run-{i}"))
        return time.perf_counter() - start

    async def one(i: int, n: int, k: int) -> str:
        with SetWorkflowID(f"batch-{n}-{i}-{k}"):  # the task's own context: its own id
            return await flow(f"batch-{n}-{i}-{k}")

    async def many(i: int, n: int) -> list[Any]:
        return await asyncio.gather(*(one(i, n, k) for k in range(n)), return_exceptions=True)

    def batch(i: int, n: int) -> tuple[float, int]:
        start = time.perf_counter()
        results = loop.run_until_complete(many(i, n))
        return time.perf_counter() - start, _failed(results)

    return run, batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--model-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5, help="rounds, median kept (5)")
    parser.add_argument(
        "--concurrency", default="32", help="runs at once, comma-separated (0 or '': skip)"
    )
    parser.add_argument("--tools", choices=("step", "effect"), default="step")
    parser.add_argument(
        "--model",
        choices=("function", "openai"),
        default="function",
        help="function: pydantic-ai's FunctionModel in this process; openai: the openai SDK "
        "over HTTP to a local server in a child process",
    )
    parser.add_argument("--no-single", action="store_true", help="skip one run at a time")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated contestants (no durability always runs): passthrough, "
        "normal, output, full, dbos",
    )
    parser.add_argument("--dir", default=None, help="parent of the temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    lost = LostLeases()
    logging.getLogger("crashproof").addHandler(lost)
    closers: list[Callable[[], Any]] = []  # ledgers, DBOS
    failed = 0
    with bench_dir(args.dir, keep=args.keep, prefix="crashproof-frameworks-") as directory:
        print_facts(machine_facts(directory))
        models = Models(args.model, args.turns, args.model_ms)
        closers.append(models.close)
        try:
            only = {name.strip() for name in args.only.split(",") if name.strip()}
            contestants: dict[str, tuple[Run, Batch] | str] = {
                "no durability": plain(args.turns, args.model_ms, models)
            }
            if not only or "passthrough" in only:
                contestants["passthrough capability"] = plain(
                    args.turns, args.model_ms, models, [Passthrough()]
                )
            for durability in ("normal", "output", "full"):
                if not only or durability in only:
                    contestants[f"crashproof ({durability})"] = crashproof(
                        args.turns,
                        args.model_ms,
                        directory,
                        durability,
                        args.tools,
                        models,
                        closers,
                    )
            if not only or "dbos" in only:
                contestants["pydantic-ai + DBOS"] = dbos(
                    args.turns, args.model_ms, directory, models, closers
                )
            pairs = {k: v for k, v in contestants.items() if not isinstance(v, str)}
            print(
                f"\n{args.turns + 1} model requests ({args.model_ms:g} ms each) and "
                f"{args.turns} tool calls per run (tools as {args.tools}s; model: "
                f"{args.model}); "
                f"Python {sys.version.split()[0]}"
            )
            for name, reason in contestants.items():
                if isinstance(reason, str):
                    print(f"{name}: skipped ({reason})")
            if not args.no_single:
                single(pairs, args.turns, args.repeats)
            for n in (int(c) for c in args.concurrency.split(",") if c.strip()):
                if n > 0:
                    cpu, wall = models.server_cpu(), time.perf_counter()
                    failed += throughput(pairs, n, args.repeats)
                    if args.model != "function":
                        busy = (models.server_cpu() - cpu) / (time.perf_counter() - wall)
                        print(f"model server: {busy:.0%} of one core over these rounds")
        finally:
            for close in closers:
                close()
    print(f"\nleases lost: {lost.count}; runs failed: {failed}")
    return 1 if lost.count or failed else 0


def single(pairs: dict[str, tuple[Run, Batch]], turns: int, repeats: int) -> None:
    """Milliseconds per run, one at a time, contestants interleaved."""
    runs = {k: v[0] for k, v in pairs.items()}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for run in runs.values():
        run(-1)  # warm up: imports, first connection
    for i in range(repeats):  # interleaved
        for name, run in runs.items():
            times[name].append(run(i))
    calls = 2 * turns + 1  # model requests + tool calls
    base = statistics.median(times["no durability"])
    print(f"\none run at a time; median of {repeats}; load avg at end {load_average()}")
    print(f"{'':24} {'ms/run':>8} {'x plain':>8} {'ms/call':>8}")
    for name in runs:
        median = statistics.median(times[name])
        extra = (median - base) * 1000 / calls
        print(f"{name:24} {median * 1000:8.1f} {median / base:8.2f} {extra:8.2f}")


def throughput(pairs: dict[str, tuple[Run, Batch]], n: int, repeats: int) -> int:
    """Runs per second with ``n`` runs at once, side by side, contestants interleaved
    in each round; returns how many runs failed."""
    walls: dict[str, list[float]] = {name: [] for name in pairs}
    failed: dict[str, int] = dict.fromkeys(pairs, 0)
    print(f"\n{n} runs at once on one event loop; {repeats} rounds")
    for i in range(repeats):
        load = load_average()
        for name, (_, batch) in pairs.items():
            wall, bad = batch(i, n)
            walls[name].append(wall)
            failed[name] += bad
        ratios = "  ".join(
            f"{name.removeprefix('crashproof ')} {walls['no durability'][i] / w[i]:.2f}"
            for name, w in walls.items()
            if name != "no durability"
        )
        print(f"  round {i + 1}: load {load}; x plain: {ratios}")
    rates = {name: n / statistics.median(w) for name, w in walls.items()}
    dbos_rate = rates.get("pydantic-ai + DBOS")
    print(f"{'':24} {'runs/s':>8} {'x plain':>8} {'x DBOS':>8} {'failed':>7}")
    base = walls["no durability"]
    for name, rate in rates.items():
        ratio = statistics.median(b / w for b, w in zip(base, walls[name], strict=True))
        vs_dbos = f"{rate / dbos_rate:8.2f}" if dbos_rate else f"{'-':>8}"
        print(f"{name:24} {rate:8.1f} {ratio:8.2f} {vs_dbos} {failed[name]:7}")
    print(f"load avg at end: {load_average()}")
    return sum(failed.values())


if __name__ == "__main__":
    raise SystemExit(main())
