"""The child of tests/crash/test_sigkill_clocks.py: run or resume one run on a host whose
clock is skewed (an injected clock, never the machine's), die by SIGKILL where told.

Usage: python clock_child.py LEDGER_URL TARGET_URL RUN_ID TOOL POINT OFFSET
  TOOL: private | shared (under POLICY: approvals) | plain | windowed | v2 (no policy)
  POINT: the crash point (CrashPoints match) where the child kills itself
  OFFSET: seconds this host's clock is ahead (negative: behind)
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any

import crashproof as cp
from crashproof.runtime.port import ActSettings
from crashproof.tools.http import HttpTool

POLICY = cp.Policy("ops-1", allow={"http": "*"}, risk={"http": "high"}, approval_required={"high"})
FROZEN = 3  # the child's exit code when the run froze instead of reaching its crash point
SETTINGS = ActSettings(max_clock_skew=0.5, window_margin=1.5, backoff=0.01)
WINDOW = 2.0  # seconds the windowed tool declares (its target forgets keys as fast)
PATHS = {"lookup_path": "/resources/by-key/{operation_id}"}


class SharedTool(HttpTool):
    """A target other callers can reach: receipts must bind the approval and a time."""

    shared = True


class BumpedTool(HttpTool):
    """The same tool, one version later, with the same params."""

    version = "2"


def tool_for(kind: str, url: str) -> HttpTool:
    if kind == "shared":
        return SharedTool(url, "/resources", **PATHS)
    if kind == "v2":
        return BumpedTool(url, "/resources", **PATHS)
    if kind == "plain":  # the intent digest from the target's header only, not the body
        return HttpTool(url, "/resources", digest_key="-", **PATHS)
    window = timedelta(seconds=WINDOW) if kind == "windowed" else None
    return HttpTool(url, "/resources", idempotency_window=window, **PATHS)


def deploy(tool: HttpTool) -> cp.Workflow[Any]:
    @cp.workflow("deploy", version="1")
    def flow(ctx: cp.Context) -> Any:
        ctx.step("plan", lambda: "plan")
        made = ctx.act("create", tool, body={"name": "a"})["id"]
        ctx.step("after", lambda: "after")
        return made

    return flow


def skewed(offset: float) -> Any:
    return lambda: time.time() + offset


def main(url: str, target: str, run_id: str, kind: str, point: str, offset: float) -> None:
    points = cp.CrashPoints(match=point, action="sigkill")
    ledger = cp.Ledger(url, crash_points=points, clock=skewed(offset), act_settings=SETTINGS)
    ledger.register_policy(POLICY)
    with tool_for(kind, target) as tool:
        flow = deploy(tool)
        ledger.register(flow)
        options = cp.RunOptions(policy=POLICY) if kind in ("private", "shared") else None
        try:
            if run_id not in {info.run_id for info in ledger.runs()}:
                ledger.run(flow, run_id=run_id, options=options)
            else:
                ledger.resume(run_id)
        except cp.RunFrozen as exc:  # refused without reaching the crash point
            print(exc, file=sys.stderr)
            sys.exit(FROZEN)
    ledger.close()


if __name__ == "__main__":
    main(*sys.argv[1:6], float(sys.argv[6]))
