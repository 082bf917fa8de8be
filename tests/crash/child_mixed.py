"""A child process for the mixed crash test: recorded errors, retries, decisions.

Usage: python child_mixed.py DB COUNTS SPEC   (SPEC: none | at:N)
Every body execution appends its key to COUNTS, so counts survive SIGKILL.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import crashproof as cp


def make(counts: Path) -> cp.Workflow[Any]:
    def note(key: str) -> int:
        with counts.open("a", encoding="utf-8") as f:
            f.write(key + "\n")
        return sum(1 for line in counts.read_text().split() if line == key)

    def add(i: int) -> int:
        note(f"add{i}")
        return i * 10

    def boom(i: int) -> int:
        note(f"boom{i}")
        raise ValueError(f"boom {i}")

    def flaky() -> str:
        if note("flaky") < 3:
            raise ConnectionError("not yet")
        return "ok"

    def ask(i: int) -> cp.Decision:
        note(f"ask{i}")
        return cp.Decision({"pick": i % 2}, model="stub", usage={"total_tokens": 10}, cost=0.5)

    @cp.workflow("mixed", version="1")
    def mixed(ctx: cp.Context, n: int) -> dict[str, Any]:
        total = 0
        picks = []
        for i in range(n):
            total += ctx.step("add", add, i)
            try:
                ctx.step("boom", boom, i)
            except ValueError as exc:
                total += len(str(exc))
            picks.append(ctx.decide("ask", ask, i)["pick"])
        retry = cp.StepOptions(retry=cp.RetryPolicy(attempts=5, backoff=0))
        status = ctx.step("flaky", flaky, options=retry)
        return {"total": total, "picks": picks, "flaky": status}

    return mixed


def main(db: Path, counts: Path, spec: str) -> None:
    points = cp.CrashPoints(at=int(spec[3:]), action="sigkill") if spec != "none" else None
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}", crash_points=points)
    ledger.run(make(counts), run_id="mixed", n=3)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
