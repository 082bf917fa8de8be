"""golden_flows with a non-deterministic change: the step's argument differs. Replaying
the golden journals against it must fail (as Temporal's replayer tests keep one)."""

from __future__ import annotations

from typing import Any

from golden_flows import NOTES, plan, summarize

import crashproof as cp


@cp.workflow("golden", version="1")
def golden(ctx: cp.Context, topic: str) -> dict[str, Any]:
    summary = ctx.step("summarize", summarize, topic + "!")  # the change
    choice = ctx.decide("plan", plan, topic)
    note = ctx.act("note", NOTES, title=choice["title"], body=summary)
    return {"summary": summary, "note": note}
