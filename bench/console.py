"""How long the console's pages take against a big ledger: 10,000 runs, one of them
20,000 steps long (the goal: <= 300 ms per page on this machine).

    .venv/bin/python bench/console.py [--runs 10000] [--steps 20000] [--repeat 5] [--db F]

Builds the ledger once (normal durability: the build is not what is measured), in a
temporary directory, or in ``--db F`` when F does not exist yet (kept, and reused by the
next run with the same ``--db``). Then renders each page through Starlette's TestClient
in process: "first" is the page's first render by a new console (a new Ledger and a new
app over the existing file, as a freshly started ``crashproof ui`` sees it; the file's
pages may be in the OS cache), then the median and worst of ``--repeat`` warm renders.
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


def build(path: Path, runs: int, steps: int) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{path}", durability="normal")
    if path.stat().st_size > 0 and ledger.store.get_run("long-run") is not None:
        print(f"reusing {path}")
        return ledger

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
    parser.add_argument("--db", type=Path, default=None, help="ledger file to build or reuse")
    args = parser.parse_args()
    from starlette.testclient import TestClient

    def client_of(ledger: cp.Ledger) -> TestClient:
        return TestClient(create_app(ConsoleConfig(ledger=ledger)), base_url="http://127.0.0.1")

    def timed(client: TestClient, path: str, params: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        response = client.get(path, params=params)
        elapsed = (time.perf_counter() - t0) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{path} {params}: HTTP {response.status_code}")
        return elapsed

    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "big.db"
        build(path, args.runs, args.steps).close()
        pages: list[tuple[str, dict[str, Any]]] = [
            ("/runs", {}),
            ("/runs", {"status": "succeeded", "offset": 5000}),
            ("/runs", {"workflow": "long"}),
            ("/runs", {"q": "run-0999"}),
            ("/run", {"id": f"run-{min(4242, args.runs - 2):05d}"}),
            ("/run", {"id": "long-run"}),
            ("/run", {"id": "long-run", "offset": 19_900}),
            ("/run/timeline", {"id": "long-run", "offset": 19_900}),
            ("/attention", {}),
        ]
        print(f"{'page':<48} {'first ms':>9} {'median ms':>10} {'worst ms':>9}")
        for page, params in pages:
            # A new console per page: its first render is what an operator who just
            # started `crashproof ui` and opened this page waits for.
            ledger = cp.Ledger(f"sqlite:///{path}", durability="normal")
            client = client_of(ledger)
            first = timed(client, page, params)
            times = [timed(client, page, params) for _ in range(args.repeat)]
            ledger.close()
            shown = page + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
            print(f"{shown:<48} {first:>9.0f} {statistics.median(times):>10.0f} {max(times):>9.0f}")


if __name__ == "__main__":
    main()
