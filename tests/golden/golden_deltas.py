"""The golden loop of text deltas (SQLite schema 7): a step that returns the whole
history, which grows by one message of ~2.5 KB (multi-byte characters included: a
delta's prefix counts characters, not bytes) a turn, so each result from the fourth on
is stored as a delta of the one before."""

from __future__ import annotations

import crashproof as cp

TURNS = 10
ASKED: list[int] = []  # the turns whose step ran (a recorded one must not)


def message(tag: str, turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"{tag} {turn} caf\u00e9 \U0001f642 " + "ab\u00e9" * 800}


def history(tag: str, turns: int) -> list[dict[str, str]]:
    return [message(tag, t) for t in range(turns)]


def grow(ctx: cp.Context, tag: str, turns: int) -> int:
    kept: list[dict[str, str]] = []
    for turn in range(turns):

        def step(kept: list[dict[str, str]] = kept, turn: int = turn) -> list[dict[str, str]]:
            ASKED.append(turn)
            return [*kept, message(tag, turn)]

        kept = ctx.step(f"turn{turn}", step)
    return len(kept)


def register(ledger: cp.Ledger) -> cp.Workflow[int]:
    return ledger.workflow("golden-deltas", version="1")(grow)
