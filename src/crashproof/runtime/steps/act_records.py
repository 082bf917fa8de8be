"""The payloads of an act's journal records, with their stored text built directly.

Every act writes two records (its intent, then its receipt), and each record's payload
is stored as JSON text. ``codec.encode`` of these small dicts is a few microseconds; the
text built here from the same fields is exactly what ``codec.encode`` returns (keys in
the payload's order, compact separators, strings escaped by the same function, floats as
``repr``), at a third of the cost. Anything unusual (an observation, a non-string tool
name, any non-ASCII text) takes ``codec.encode`` itself. tests/unit/test_act_records.py
pins the equality.
"""

from __future__ import annotations

from json.encoder import encode_basestring as _quoted
from typing import Any

from crashproof.journal import payloads
from crashproof.journal.codec import encode
from crashproof.journal.records import StepKind, StepStatus
from crashproof.tools.port import Call, Tool

__all__ = ["intent_payload", "receipt_payload"]

_ACT = StepKind.ACT.value
_SUCCEEDED = StepStatus.SUCCEEDED.value
_TEXT = "the payload of an act record"


def intent_payload(
    tool: Tool, call: Call, started: float, observed: dict[str, Any] | None
) -> tuple[dict[str, Any], str]:
    """An ``act_intent`` payload and its stored text."""
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
    if observed:  # runtime/steps/environment.py
        intent["observed"] = observed
        return payloads.as_dict(intent), encode(intent, what=_TEXT)
    payload = payloads.as_dict(intent)
    name, version, attempt = tool.name, tool.version, call.attempt
    if not (type(name) is str and type(version) is str and type(attempt) is int):
        return payload, encode(payload, what=_TEXT)
    quoted = _quoted(digest)
    text = (
        f'{{"kind":"{_ACT}","digest":{quoted},"operation_id":{_quoted(call.operation_id)},'
        f'"intent_digest":{quoted},"tool":{_quoted(name)},"tool_version":{_quoted(version)},'
        f'"attempt":{attempt},"started_at":{_float(started)}}}'
    )
    return payload, text if text.isascii() else encode(payload, what=_TEXT)


def receipt_payload(
    tool: Tool,
    call: Call,
    receipt_id: str,
    result_digest: str,
    reconciled: bool,
    took_us: int,
    observed: dict[str, Any],
) -> tuple[dict[str, Any], str]:
    """A successful act's ``step_done`` payload and its stored text. ``observed``: the
    environment as the act left it (``{"observed": ...}``, or nothing)."""
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
    if observed:  # {"observed": ...} (observe_after), the last key; or nothing
        receipt["observed"] = observed["observed"]
    payload = payloads.as_dict(receipt)
    name, version, attempt = tool.name, tool.version, call.attempt
    if observed or not (
        type(name) is str
        and type(version) is str
        and type(attempt) is int
        and type(receipt_id) is str
        and type(took_us) is int
        and type(reconciled) is bool
    ):
        return payload, encode(payload, what=_TEXT)
    quoted = _quoted(digest)
    text = (
        f'{{"kind":"{_ACT}","digest":{quoted},"status":"{_SUCCEEDED}","attempt":{attempt},'
        f'"operation_id":{_quoted(call.operation_id)},"intent_digest":{quoted},'
        f'"receipt":{{"tool":{_quoted(name)},"tool_version":{_quoted(version)},'
        f'"receipt_id":{_quoted(receipt_id)},"result_digest":{_quoted(result_digest)},'
        f'"reconciled":{"true" if reconciled else "false"}}},"took_us":{took_us}}}'
    )
    return payload, text if text.isascii() else encode(payload, what=_TEXT)


def _float(value: float) -> str:
    """A timestamp as the JSON encoder writes a float (its repr); a non-float (or a
    non-finite one, which the encoder refuses) is encoded by codec.encode's rules."""
    if type(value) is float and value - value == 0.0:
        return repr(value)
    return encode(value, what=_TEXT)
