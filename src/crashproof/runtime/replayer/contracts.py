"""Tool contract versions: what a declared mapping from an older contract says.

A tool's ``version`` is its contract version and part of every intent digest, so an act
recorded under contract 1 and replayed by code calling contract 2 never matches: the run
freezes in ``needs_review`` (a resume) or is reported non-deterministic (``crashproof
replay``), never re-run silently. A tool may declare ``contract_mappings = {"1": fn}``,
``fn(old_params) -> new_params``: the replay report (and a reviewer) can then tell whether
the change is exactly that mapping, i.e. whether the recorded intent, mapped to the new
contract, is the intent the code now makes.
"""

from __future__ import annotations

from typing import Any

from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType
from crashproof.runtime.steps.act_records import intent_digest
from crashproof.tools.port import Tool

__all__ = ["contract_mapping", "explain_contract_change", "map_params"]


def map_params(tool: Tool, from_version: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """``params`` of contract ``from_version`` mapped to ``tool``'s contract, or None when
    the tool declares no mapping from that version. A mapping that fails raises."""
    if from_version == tool.version:
        return dict(params)
    mapping = tool.contract_mappings.get(from_version)
    if mapping is None:
        return None
    mapped = mapping(dict(params))
    if not isinstance(mapped, dict):
        raise TypeError(
            f"tool {tool.name!r}: the contract mapping from version {from_version!r} returned "
            f"{type(mapped).__name__}, not a dict of params"
        )
    return mapped


def explain_contract_change(
    tool: Tool, intent: Event | None, params: dict[str, Any], key: str
) -> str | None:
    """For an act whose recorded intent differs from the code's: whether the tool's contract
    changed, and whether its declared mapping explains the difference. None when the
    contract did not change (the params did)."""
    if intent is None:
        return None
    payloads.expect(intent, EventType.ACT_INTENT)
    recorded_intent = payloads.act_intent(intent)
    old_tool, old = recorded_intent.get("tool"), str(recorded_intent.get("tool_version"))
    if old_tool != tool.name or old == tool.version:
        return None
    change = f"tool {tool.name!r} contract changed {old} -> {tool.version}"
    recorded = intent.value.get("params") if isinstance(intent.value, dict) else None
    if not isinstance(recorded, dict):
        return f"{change}; the recorded intent holds no params to map"
    try:
        mapped = map_params(tool, old, recorded)
    except Exception as exc:  # the user's mapping: report it, never raise into the check
        return f"{change}; its mapping from {old} failed: {type(exc).__name__}: {exc}"
    if mapped is None:
        return f"{change} and it declares no mapping from {old} (a review must decide)"
    if intent_digest(tool, mapped, key) == intent_digest(tool, params, key):
        return f"{change}; its declared mapping explains the change (a review can apply it)"
    return f"{change}; its declared mapping does not explain the change (params differ)"


def contract_mapping(
    tool: Tool, intent: Event | None, params: dict[str, Any], key: str
) -> dict[str, Any] | None:
    """For an act recorded under another contract of ``tool``: what applying its declared
    mapping does (key, tool, from/to version, from/to intent digest), when the mapping
    maps the recorded params exactly to ``params``; else None (no mapping, one that fails
    or one that does not explain the change: a review decides)."""
    if intent is None:
        return None
    recorded_intent = payloads.act_intent(intent)
    old = str(recorded_intent.get("tool_version"))
    recorded = intent.value.get("params") if isinstance(intent.value, dict) else None
    if recorded_intent.get("tool") != tool.name or old == tool.version:
        return None
    if not isinstance(recorded, dict):
        return None
    try:
        mapped = map_params(tool, old, recorded)
    except Exception:  # the user's mapping failed: explain_contract_change reports it
        return None
    if mapped is None or intent_digest(tool, mapped, key) != intent_digest(tool, params, key):
        return None
    return {
        "key": key,
        "tool": tool.name,
        "from_version": old,
        "to_version": tool.version,
        "from_digest": recorded_intent.get("digest"),
        "to_digest": intent_digest(tool, params, key),
    }
