"""The payloads of an act's two journal records: its intent, then its receipt (or a
failure the tool vouched for), and a receipt's result as stored or kept as evidence.

Stored through ``codec.encode`` like every other payload. A text built by hand here once
saved ~2.4 µs of an act that takes ~360 µs (0.7 %: bench/handbuilt.py, 2026-12-01), under
the 5 % a hand-built text must buy on a whole run to stay.
"""

from __future__ import annotations

import time
from typing import Any

from crashproof.errors import CrashproofError
from crashproof.journal import payloads
from crashproof.journal.codec import encode
from crashproof.journal.records import StepKind, StepStatus
from crashproof.tools.port import Call, Receipt, Tool

__all__ = [
    "failed_payload",
    "intent_payload",
    "receipt_evidence",
    "receipt_json",
    "receipt_payload",
]

_ACT = StepKind.ACT.value
_SUCCEEDED = StepStatus.SUCCEEDED.value
_FAILED = StepStatus.FAILED.value


def intent_payload(
    tool: Tool, call: Call, started: float, observed: dict[str, Any] | None
) -> payloads.ActIntent:
    """An ``act_intent`` payload; ``observed``: the environment before the act
    (``runtime/steps/environment.py``), when the tool observes one."""
    digest = call.intent_digest
    intent: payloads.ActIntent = {
        "kind": _ACT,
        "digest": digest,
        "operation_id": call.operation_id,
        "intent_digest": digest,
        "tool": tool.name,
        "tool_version": tool.version,
        "attempt": call.attempt,
        "started_at": started,
    }
    if observed:
        intent["observed"] = observed
    return intent


def receipt_payload(
    tool: Tool,
    call: Call,
    receipt_id: str,
    result_digest: str,
    reconciled: bool,
    took_us: int,
    observed: dict[str, Any],
) -> payloads.StepDone:
    """A successful act's ``step_done`` payload. ``observed``: the environment as the act
    left it (``{"observed": ...}``, or nothing)."""
    digest = call.intent_digest
    receipt: payloads.StepDone = {
        "kind": _ACT,
        "digest": digest,
        "status": _SUCCEEDED,
        "attempt": call.attempt,
        "operation_id": call.operation_id,
        "intent_digest": digest,
        "receipt": {
            "tool": tool.name,
            "tool_version": tool.version,
            "receipt_id": receipt_id,
            "result_digest": result_digest,
            "reconciled": reconciled,
        },
        # It ended when its record is made (created_at): the duration as whole
        # microseconds, as steps record it (journal/fold.py step_times reads both).
        "took_us": took_us,
    }
    if observed:  # the last key
        receipt["observed"] = observed["observed"]
    return receipt


def failed_payload(
    call: Call, error: dict[str, Any], cause: dict[str, Any], started: float, failure: str
) -> payloads.StepDone:
    """A failed act's ``step_done`` payload: a failure the tool vouched for (``failure``:
    ``permanent`` or ``retryable``; ``error``: the ActFailed's record, ``cause``: the
    tool's error's)."""
    return payloads.StepDone(
        kind=_ACT,
        digest=call.intent_digest,
        status=_FAILED,
        failure=failure,
        attempt=call.attempt,
        operation_id=call.operation_id,
        intent_digest=call.intent_digest,
        error=error,
        cause=cause,
        started_at=started,
        ended_at=time.time(),
    )


def receipt_evidence(receipt: Receipt) -> dict[str, Any]:
    """What a freeze keeps of a receipt it could not take."""
    return {
        "receipt_id": receipt.receipt_id,
        "intent_digest": receipt.intent_digest,
        "result": receipt.result,
    }


def receipt_json(receipt: Any, step: str) -> tuple[str, str | None]:
    """The receipt's result as stored JSON, or what is wrong with the receipt."""
    if not isinstance(receipt, Receipt):
        return "", f"expected a cp.Receipt, got {type(receipt).__name__}"
    if not isinstance(receipt.receipt_id, str) or not receipt.receipt_id:
        return "", "the receipt has no receipt_id"
    try:
        return encode(receipt.result, what=f"the result of act {step!r}"), None
    except CrashproofError as exc:
        return "", str(exc)
