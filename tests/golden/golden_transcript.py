"""The golden agent loop: a message list that grows by two messages a turn, passed whole
to ``ctx.decide`` (arguments digest format 1 when recorded by crashproof before #22, at
commit 715fd4e; format 2 since). ``EDIT``: the same loop with its first message
changed, which must be a non-determinism on replay."""

from __future__ import annotations

from typing import Any

import crashproof as cp

TURNS = 4
EDIT = {"on": False}
ASKED: list[int] = []  # the turns whose decision ran (a recorded one must not)


def model(messages: list[dict[str, Any]], model: str) -> dict[str, str]:
    ASKED.append(len(messages))
    return {"role": "assistant", "content": f"reply {len(messages)} \u2014 caf\u00e9"}


def agent(ctx: cp.Context, task: str) -> int:
    system = "be brief (edited)" if EDIT["on"] else "be brief"
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"{task} {turn}", "n": turn, "ok": True})
        messages.append(ctx.decide("turn", model, messages, model="m-1"))
    return len(messages)


def register(ledger: cp.Ledger) -> cp.Workflow[int]:
    return ledger.workflow("golden-agent", version="1")(agent)
