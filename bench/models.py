"""The model recorder's cost per call, against a raw SDK call to the same local server.

    .venv/bin/python bench/models.py [--calls 300] [--repeats 5] [--delays 1,50] [--dir /tmp]

The server is ``examples/_model_server.py`` (Chat Completions over HTTP on 127.0.0.1, in
this process) answering every request after ``delay`` ms. For each delay, sync and async:

- raw: ``client.chat.completions.create(model=, messages=)`` N times on ``OpenAI`` /
  ``AsyncOpenAI`` (``max_retries=0``, as the recorder sets it), µs per call;
- recorded: one workflow run on a fresh SQLite ledger (the default ``output``
  durability) making the same N calls through ``cp.models.openai_chat(ctx, client)``
  (``run`` / ``run_async``: the run's start and end are in the figure), µs per call;
- the ratio recorded / raw (the median of the per-round ratios), the overhead in µs, and
  the noise: the spread (max - min) of the raw call's µs across rounds. An overhead under
  the noise cannot be told from it;
- the recorder's CPU per call: this process's CPU time per call, recorded minus raw (the
  client, the server's thread and the SDK are on both sides), and that as a share of the
  raw call's wall time: what the recorder costs on a machine whose other work does not
  stretch the wall clock (the wall figures on a busy machine carry its scheduling).

N is ``--calls`` at 1 ms and an eighth of it (at least 20) at the slower delays. Rounds
interleave raw and recorded, the order reversed every other round.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
from _common import (
    exit_on_sigterm,
    interleaved,
    machine_facts,
    make_tempdir,
    median,
    print_facts,
    print_table,
    remove_db,
    round_ratios,
)

import crashproof as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples._model_server import ModelServer

MODEL = "gpt-4.1"
# A system prompt and a question of a few hundred bytes, as a short agent turn sends.
MESSAGES = [
    {"role": "system", "content": "You are a careful code agent. " * 12},
    {"role": "user", "content": "Which file defines greet()? Answer with its path."},
]


def sync_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="local",
        base_url=url,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=False),
    )


def async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key="local",
        base_url=url,
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=False),
    )


class Clock:
    """Wall and CPU time (this process's: the client, the recorder and the server's
    thread, the same for both sides but for what the recorder adds), in µs per call."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        return wall / self.n * 1e6, cpu / self.n * 1e6


def raw_sync(client: openai.OpenAI, n: int) -> tuple[float, float]:
    client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    clock = Clock(n)
    for _ in range(n):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    return clock.stop()


def raw_async(url: str, n: int) -> tuple[float, float]:
    async def calls() -> tuple[float, float]:
        client = async_client(url)  # a client per event loop: its connections are bound to it
        await client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        clock = Clock(n)
        for _ in range(n):
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        took = clock.stop()
        await client.close()
        return took

    return asyncio.run(calls())


def recorded_sync(client: openai.OpenAI, directory: Path, n: int, tag: str) -> tuple[float, float]:
    @cp.workflow("bench-models", version="1")
    def calls(ctx: cp.Context, n: int) -> int:
        llm = cp.models.openai_chat(ctx, client)
        for _ in range(n):
            llm.create(model=MODEL, messages=MESSAGES)
        return n

    path = directory / f"{tag}.db"
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        clock = Clock(n)
        ledger.run(calls, run_id=tag, n=n)
        took = clock.stop()
    remove_db(path)
    return took


def recorded_async(url: str, directory: Path, n: int, tag: str) -> tuple[float, float]:
    path = directory / f"{tag}.db"

    async def drive() -> tuple[float, float]:
        client = async_client(url)

        @cp.workflow("bench-models-async", version="1")
        async def calls(ctx: cp.AsyncContext, n: int) -> int:
            llm = cp.models.openai_chat(ctx, client)
            for _ in range(n):
                await llm.create(model=MODEL, messages=MESSAGES)
            return n

        with cp.Ledger(f"sqlite:///{path}") as ledger:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
            clock = Clock(n)
            await ledger.run_async(calls, run_id=tag, n=n)
            took = clock.stop()
        await client.close()
        return took

    took = asyncio.run(drive())
    remove_db(path)
    return took


def _walls(
    measure: Callable[[str], tuple[float, float]], cpu: list[float]
) -> Callable[[str], float]:
    """``measure`` as ``interleaved`` takes it (the wall time), its CPU time kept aside."""

    def run(tag: str) -> float:
        wall, used = measure(tag)
        cpu.append(used)
        return wall

    return run


def measure(delay_ms: float, n: int, repeats: int, directory: Path) -> list[list[str]]:
    server = ModelServer([("ok", [])], delay=delay_ms / 1000).start()
    rows = []
    try:
        sync = sync_client(server.url)
        shells: dict[str, dict[str, Any]] = {
            "sync": {
                "raw": lambda tag: raw_sync(sync, n),
                "recorded": lambda tag: recorded_sync(sync, directory, n, tag),
            },
            "async": {
                "raw": lambda tag: raw_async(server.url, n),
                "recorded": lambda tag: recorded_async(server.url, directory, n, f"a{tag}"),
            },
        }
        for shell, measures in shells.items():
            cpu: dict[str, list[float]] = {"raw": [], "recorded": []}
            walls = {side: _walls(fn, cpu[side]) for side, fn in measures.items()}
            got = interleaved(repeats, walls)
            raw, recorded = median(got["raw"]), median(got["recorded"])
            ratio = median(round_ratios(got["recorded"], got["raw"]))
            noise = max(got["raw"]) - min(got["raw"])
            extra_cpu = median([a - b for a, b in zip(cpu["recorded"], cpu["raw"], strict=True)])
            rows.append(
                [
                    f"{delay_ms:g} ms",
                    shell,
                    str(n),
                    f"{raw:,.0f}",
                    f"{recorded:,.0f}",
                    f"{recorded - raw:+,.0f}",
                    f"{noise:,.0f}",
                    f"{ratio:.3f}",
                    f"{extra_cpu:+,.0f}",
                    f"{extra_cpu / raw:+.1%}",
                ]
            )
        sync.close()
    finally:
        server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--delays", default="1,50", help="server delays in ms, comma-separated")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    directory = make_tempdir(args.dir)
    try:
        print("bench/models.py: the model recorder against a raw SDK call, same local server")
        print_facts(machine_facts(directory))
        rows = []
        for delay in (float(d) for d in args.delays.split(",")):
            n = args.calls if delay < 10 else max(20, args.calls // 8)
            rows += measure(delay, n, args.repeats, directory)
        print()
        headers = ["server", "shell", "calls", "raw µs", "recorded µs", "overhead µs"]
        headers += ["raw noise µs", "ratio", "recorder CPU µs", "CPU / raw call"]
        print_table(headers, rows)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    with exit_on_sigterm():  # a SIGTERM still runs the finally blocks (servers, temp dirs)
        raise SystemExit(main())
