"""The workflow the golden journals were recorded with (tests/golden/make_golden.py).

Keep it exactly as it is: the golden ledgers hold runs of this code, and CI replays them
against it on every change (a change here that is not replay-compatible must fail)."""

from __future__ import annotations

from typing import Any, ClassVar

import crashproof as cp


class Notes(cp.Tool):
    """An idempotent in-process tool: one note per operation id."""

    name = "notes"
    version = "1"
    idempotent_execute = True
    sent: ClassVar[dict[str, dict[str, Any]]] = {}

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.sent.setdefault(call.operation_id, dict(call.params))
        return cp.Receipt(call.operation_id, {"title": call.params["title"]}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if call.operation_id not in self.sent:
            return None
        return cp.Receipt(
            call.operation_id, {"title": self.sent[call.operation_id]["title"]}, call.intent_digest
        )


NOTES = Notes()


def summarize(text: str) -> str:
    return text.upper()


def plan(topic: str) -> cp.Decision:
    return cp.Decision(
        {"title": f"about {topic}"},
        model="golden-model",
        usage={"input_tokens": 3, "output_tokens": 2},
        cost=0.001,
    )


@cp.workflow("golden", version="1")
def golden(ctx: cp.Context, topic: str) -> dict[str, Any]:
    summary = ctx.step("summarize", summarize, topic)
    choice = ctx.decide("plan", plan, topic)
    note = ctx.act("note", NOTES, title=choice["title"], body=summary)
    return {"summary": summary, "note": note}
