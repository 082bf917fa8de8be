"""An act's record payloads (runtime/steps/act_records.py): their keys in the order the
journal format has them, and in a journal stored exactly as codec.encode writes them."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.journal.codec import encode
from crashproof.journal.records import EventType
from crashproof.runtime.steps.act_records import intent_payload, receipt_payload
from crashproof.tools.port import Call, Receipt, Tool

DIGEST = "ab" * 32


class Named(Tool):
    name: ClassVar[str] = "noop"
    version: ClassVar[str] = "1"

    def execute(self, call: Call) -> Receipt:
        return Receipt(call.operation_id, {"ok": True}, call.intent_digest)


def tool_named(name: Any, version: Any) -> Tool:
    tool = Named()
    tool.name = name  # type: ignore[misc]
    tool.version = version  # type: ignore[misc]
    return tool


def call(run_id: str = "run-1", step: str = "act#2", attempt: int = 1) -> Call:
    return Call(
        run_id=run_id,
        step=step,
        operation_id=f"{run_id}/{step}",
        intent_digest=DIGEST,
        params={},
        attempt=attempt,
    )


CALLS = [
    call(),
    call(run_id='quote " and \\ backslash', attempt=3),
    call(run_id="tab\tnewline\n", step="é#2"),
    call(run_id="snow \u2603"),
    call(run_id="lone \udc80 surrogate"),
]
TOOLS = [Named(), tool_named("naïve", "2.0"), tool_named("x", 2), tool_named(None, "1")]
TIMES = [1764412345.123456, 1.0, 0.0, 1e22, 1764412345.0]


@pytest.mark.parametrize("the_call", CALLS)
@pytest.mark.parametrize("tool", TOOLS)
def test_intent_payload_keys_in_format_order(the_call: Call, tool: Tool) -> None:
    for started in TIMES:
        for observed in (None, {}, {"before": {"instance": "i"}, "expected": None}):
            payload = intent_payload(tool, the_call, started, observed)
            assert encode(payload, what="t")  # any tool name or run id stays storable
            assert list(payload)[:8] == [
                "kind",
                "digest",
                "operation_id",
                "intent_digest",
                "tool",
                "tool_version",
                "attempt",
                "started_at",
            ]
            assert ("observed" in payload) is bool(observed)


@pytest.mark.parametrize("the_call", CALLS)
@pytest.mark.parametrize("tool", TOOLS)
def test_receipt_payload_keys_in_format_order(the_call: Call, tool: Tool) -> None:
    for reconciled in (False, True):
        for receipt_id in ("rec-1", "réc \u2603", "lone \udc81"):
            for observed in ({}, {"observed": {"instance": "i", "fingerprint": "f"}}):
                payload = receipt_payload(
                    tool, the_call, receipt_id, DIGEST, reconciled, 1234, observed
                )
                assert encode(payload, what="t")
                assert list(payload)[:4] == ["kind", "digest", "status", "attempt"]
                assert payload["receipt"]["reconciled"] is reconciled
                assert ("observed" in payload) is bool(observed)


def test_act_records_in_a_journal_store_exactly_their_encoding() -> None:
    with cp.Ledger("memory://") as ledger:

        @ledger.workflow("acts", version="1")
        def acts(ctx: cp.Context) -> int:
            for i in range(3):
                ctx.act("send", Named(), i=i)
            return 3

        assert ledger.run(acts, run_id="r \u2603") == 3
        events = ledger._store.load_events("r \u2603")  # type: ignore[attr-defined]
    act_records = [e for e in events if e.key and e.key.startswith("send")]
    assert [e.type for e in act_records] == [EventType.ACT_INTENT, EventType.STEP_DONE] * 3
    for event in act_records:
        assert event.payload_text == encode(event.payload, what="a payload"), event.key
