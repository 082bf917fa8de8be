"""The golden agent loop whose requests were stored inline, as the ``request`` field of
each decision's record (SQLite schema 8, ``store_requests=True``, before requests were
kept beside their records): run q-done (3 turns) and q-inflight (crashed after its
second turn). Built by ``make_golden.py requests8`` at commit 46696e9."""

from __future__ import annotations

from typing import Any

import crashproof as cp

TURNS = 3
ASKED: list[int] = []  # the turns whose decision ran (a recorded one must not)


def model(messages: list[dict[str, Any]], model: str) -> dict[str, str]:
    ASKED.append(len(messages))
    return {"role": "assistant", "content": f"reply {len(messages)} \u2014 caf\u00e9"}


def agent(ctx: cp.Context, task: str) -> int:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"{task} {turn}"})
        messages.append(ctx.decide("turn", model, messages=messages, model="m-1"))
    return len(messages)


def register(ledger: cp.Ledger) -> cp.Workflow[int]:
    return ledger.workflow("golden-requests", version="1")(agent)
