"""First paint of a 10,000-step run's page in headless Chromium (goal: under 1 s).

    .venv/bin/python bench/console_first_paint.py [--steps 10000] [--repeat 5] [--db F]

A benchmark, not a test: numbers go to docs/benchmarks.md with the machine, date and
load. Builds (or reuses, with ``--db F``) a ledger holding one run of ``--steps`` steps,
each a model-like decision with a recorded value, plus a few small runs. Then serves
the console over it with uvicorn on the loopback, as ``crashproof ui`` does (a new
Ledger over the file), and opens ``/run?id=long-run`` in Chromium (Debian's
``chromium`` through Playwright):

- "cold": the first load by a freshly started console (its folds empty; the file may be
  in the OS cache);
- "warm": ``--repeat`` later loads, median and worst.

For each: the server's time to answer (``responseEnd`` of the navigation, from its
start), first contentful paint (Chromium's ``first-contentful-paint`` paint entry, from
the navigation's start), and the HTML's size.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)

import uvicorn
from playwright.sync_api import sync_playwright

import crashproof as cp
from crashproof.console import ConsoleConfig, create_app


def build(path: Path, steps: int) -> None:
    with cp.Ledger(f"sqlite:///{path}", durability="normal") as ledger:
        if ledger.store.get_run("long-run") is not None:
            print(f"reusing {path}")
            return

        @ledger.workflow("small", version="1")
        def small(ctx: cp.Context, n: int) -> int:
            return ctx.step("one", lambda: n)

        @ledger.workflow("long", version="1")
        def long(ctx: cp.Context, n: int) -> int:
            for i in range(n):
                ctx.decide(
                    "turn",
                    lambda i=i: cp.Decision(
                        {"say": f"step {i}: looked at the file, next edit", "tool": "edit"},
                        model="m-1",
                        usage={"input_tokens": 120, "output_tokens": 30},
                        cost=0.0004,
                    ),
                )
            return n

        started = time.perf_counter()
        for i in range(20):
            ledger.run(small, run_id=f"small-{i:02d}", n=i)
        ledger.run(long, run_id="long-run", n=steps)
        print(f"built a {steps}-step run in {time.perf_counter() - started:.0f} s")


@contextlib.contextmanager
def served(ledger: cp.Ledger) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    app = create_app(ConsoleConfig(ledger=ledger))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def load(tab: Any, url: str) -> tuple[float, float, int]:
    """One navigation: server answer ms, first contentful paint ms, HTML bytes."""
    tab.goto("about:blank")
    response = tab.goto(url, wait_until="load")
    if response is None or response.status != 200:
        raise SystemExit(f"{url}: HTTP {response.status if response else '?'}")
    # The paint entry can land after the load event: wait for it (3 s at most).
    timing = tab.evaluate(
        """() => new Promise(resolve => {
            const t0 = performance.now();
            const poll = () => {
                const nav = performance.getEntriesByType('navigation')[0];
                const fcp = performance.getEntriesByName('first-contentful-paint')[0];
                if (fcp || performance.now() - t0 > 3000) {
                    resolve([nav.responseEnd - nav.startTime, fcp ? fcp.startTime : -1]);
                } else {
                    setTimeout(poll, 10);
                }
            };
            poll();
        })"""
    )
    if timing[1] < 0:
        raise SystemExit(f"{url}: Chromium recorded no first-contentful-paint within 3 s")
    return float(timing[0]), float(timing[1]), len(response.body())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", type=Path, default=None, help="ledger file to build or reuse")
    args = parser.parse_args()
    binary = os.environ.get("CRASHPROOF_CHROMIUM") or shutil.which("chromium")
    if binary is None:
        raise SystemExit("no Chromium binary: apt-get install chromium, or set CRASHPROOF_CHROMIUM")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "long.db"
        build(path, args.steps)
        ledger = cp.Ledger(f"sqlite:///{path}", durability="normal")
        with served(ledger) as base, sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=binary, headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            tab = browser.new_page(viewport={"width": 1280, "height": 800})
            url = f"{base}/run?id=long-run"
            cold = load(tab, url)
            warm = [load(tab, url) for _ in range(args.repeat)]
            browser.close()
        ledger.close()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}, {os.cpu_count()} cores")
    print(f"{'':<6} {'server ms':>10} {'first paint ms':>15} {'HTML KB':>8}")
    print(f"{'cold':<6} {cold[0]:>10.0f} {cold[1]:>15.0f} {cold[2] / 1024:>8.0f}")
    server_ms = [w[0] for w in warm]
    paint_ms = [w[1] for w in warm]
    print(
        f"{'warm':<6} {statistics.median(server_ms):>10.0f} {statistics.median(paint_ms):>15.0f} "
        f"{warm[0][2] / 1024:>8.0f}   (median of {args.repeat}; worst paint {max(paint_ms):.0f})"
    )


if __name__ == "__main__":
    main()
