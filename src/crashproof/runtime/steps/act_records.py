"""The payloads of an act's two journal records: its intent, then its receipt (or a
failure the tool vouched for), and a receipt's result as stored or kept as evidence;
the digests an intent carries (``intent_digest``, ``hold_digest``).

Stored through ``codec.encode`` like every other payload. A text built by hand here once
saved ~2.4 µs of an act that takes ~360 µs (0.7 %: bench/handbuilt.py, 2026-12-01), under
the 5 % a hand-built text must buy on a whole run to stay.
"""

from __future__ import annotations

import time
from json.encoder import encode_basestring as _quoted
from typing import Any

from crashproof.errors import CrashproofError
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest, encode, sha256_hex
from crashproof.journal.records import StepKind, StepStatus
from crashproof.tools.port import Call, Receipt, Tool

__all__ = [
    "failed_payload",
    "hold_digest",
    "intent_digest",
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


def intent_digest(tool: Tool, params: dict[str, Any], key: str) -> str:
    """SHA-256 of the RFC 8785 form of ``{tool, tool_version, params}``."""
    text = _flat_intent(tool, params)
    if text is not None:
        return sha256_hex(text.encode())
    return canonical_digest(
        {"tool": tool.name, "tool_version": tool.version, "params": params},
        what=f"the params of act {key!r}",
    )


def hold_digest(tool: Tool, params: dict[str, Any], key: str) -> str:
    """SHA-256 of the RFC 8785 form of ``{tool, params}``: the operation's identity
    without the tool's version, what holds on unresolved acts match (steps/holds.py). A
    new version of the tool with the same params is the same operation; another intent
    is other params."""
    text = _flat_intent(tool, params, versioned=False)
    if text is not None:
        return sha256_hex(text.encode())
    return canonical_digest(
        {"tool": tool.name, "params": params}, what=f"the params of act {key!r}"
    )


_SAFE_INT = 2**53 - 1  # RFC 8785: integers exact as IEEE doubles


def _flat_intent(tool: Tool, params: dict[str, Any], *, versioned: bool = True) -> str | None:
    """The RFC 8785 text of the intent when ``params`` is flat (ASCII keys to ASCII
    strings, safe ints, bools or None: the usual act) and the tool's name and version
    are ASCII; else None (canonical_digest decides). For these values RFC 8785 is the
    sorted, compact JSON below, byte for byte (tests/unit/test_digests.py). Kept: ~1.0 µs,
    8 % of a ~12 µs replayed act (A/B +9-15 %), 0.3 % of a live one (bench/handbuilt.py)."""
    name, version = tool.name, tool.version
    if not (type(name) is str and type(version) is str and name.isascii() and version.isascii()):
        return None
    if type(params) is not dict:
        return None
    items = []
    for k, v in params.items():
        if type(k) is not str or not k.isascii():
            return None
        t = type(v)
        if t is str:
            if not v.isascii():
                return None
            items.append((k, _quoted(v)))
        elif t is int:
            if not -_SAFE_INT <= v <= _SAFE_INT:
                return None
            items.append((k, str(v)))
        elif t is bool:
            items.append((k, "true" if v else "false"))
        elif v is None:
            items.append((k, "null"))
        else:
            return None
    items.sort()  # ASCII keys: code-point order is RFC 8785's UTF-16 order
    body = ",".join(_quoted(k) + ":" + text for k, text in items)
    if not versioned:  # the hold digest's form: {params, tool}
        return f'{{"params":{{{body}}},"tool":{_quoted(name)}}}'
    return f'{{"params":{{{body}}},"tool":{_quoted(name)},"tool_version":{_quoted(version)}}}'
