"""One process of test_first_open.py: opens the shared ledger (new, or being created by
the others at the same moment) and drives one short run of its own."""

from __future__ import annotations

import sys

import crashproof as cp

path, run_id = sys.argv[1], sys.argv[2]
ledger = cp.Ledger(f"sqlite:///{path}", key="42" * 32)


@ledger.workflow("first-open", version="1")
def flow(ctx: cp.Context) -> int:
    return int(ctx.step("one", lambda: 7))


try:
    print(ledger.run(flow, run_id=run_id))
finally:
    ledger.close()
