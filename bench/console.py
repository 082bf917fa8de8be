"""How long the console's pages take against a big ledger: 10,000 runs, one of them
20,000 steps long (the goal: <= 300 ms per page on this machine).

    .venv/bin/python bench/console.py [--runs 10000] [--steps 20000] [--repeat 5]

Builds the ledger once in a temporary directory (normal durability: the build is not
what is measured), then renders each page through Starlette's TestClient in process and
prints the median and worst of ``--repeat`` renders. The first render of /attention is
printed apart: it reads every ended run's journal once for undelivered outbox messages
(runtime/operations/browse.py Folds), later ones only what changed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)

import crashproof as cp
from crashproof.console import ConsoleConfig, create_app


def build(root: Path, runs: int, steps: int) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{root / 'big.db'}", durability="normal")

    @ledger.workflow("small", version="1")
    def small(ctx: cp.Context, n: int) -> int:
        ctx.step("one", lambda: n)
        return ctx.step("two", lambda: n + 1)

    @ledger.workflow("long", version="1")
    def long(ctx: cp.Context, n: int) -> int:
        for i in range(n):
            ctx.step("turn", lambda i=i: i)
        return n

    started = time.perf_counter()
    for i in range(runs - 1):
        ledger.run(small, run_id=f"run-{i:05d}", n=i)
    ledger.run(long, run_id="long-run", n=steps)
    print(f"built {runs} runs ({steps} steps in long-run) in {time.perf_counter() - started:.0f} s")
    return ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from starlette.testclient import TestClient

    with tempfile.TemporaryDirectory() as tmp:
        ledger = build(Path(tmp), args.runs, args.steps)
        client = TestClient(create_app(ConsoleConfig(ledger=ledger)), base_url="http://127.0.0.1")
        first = time.perf_counter()
        client.get("/attention")
        print(
            f"/attention, first render (reads every ended journal once): "
            f"{(time.perf_counter() - first) * 1000:.0f} ms"
        )
        pages: list[tuple[str, dict[str, Any]]] = [
            ("/runs", {}),
            ("/runs", {"status": "succeeded", "offset": 5000}),
            ("/runs", {"workflow": "long"}),
            ("/runs", {"q": "run-0999"}),
            ("/run", {"id": "run-04242"}),
            ("/run", {"id": "long-run"}),
            ("/run", {"id": "long-run", "offset": 19_900}),
            ("/run/timeline", {"id": "long-run", "offset": 19_900}),
            ("/attention", {}),
        ]
        print(f"{'page':<48} {'median ms':>10} {'worst ms':>10}")
        for path, params in pages:
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                response = client.get(path, params=params)
                times.append((time.perf_counter() - t0) * 1000)
                if response.status_code != 200:
                    raise SystemExit(f"{path} {params}: HTTP {response.status_code}")
            shown = path + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
            print(f"{shown:<48} {statistics.median(times):>10.0f} {max(times):>10.0f}")
        ledger.close()


if __name__ == "__main__":
    main()
