"""A target system with its own durable state (a JSON file), and tools over it: used by
the act-protocol and reconciliation tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp


class Target:
    """An external system: creates one record per idempotency key, counts every call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            path.write_text(json.dumps({"records": {}, "executes": {}, "lookups": {}}))

    def state(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())  # type: ignore[no-any-return]

    def save(self, state: dict[str, Any]) -> None:
        self.path.write_text(json.dumps(state))

    def count(self, kind: str, key: str) -> int:
        return int(self.state()[kind].get(key, 0))


class TargetTool(cp.Tool):
    name: ClassVar[str] = "target"
    version: ClassVar[str] = "1"

    def __init__(self, target: Target, script: list[str] | None = None) -> None:
        self.target = target
        self.script = list(script or [])  # per-call behaviours: "ok", "lost", "timeout", ...

    def execute(self, call: cp.Call) -> cp.Receipt:
        state = self.target.state()
        key = call.operation_id
        state["executes"][key] = state["executes"].get(key, 0) + 1
        how = self.script.pop(0) if self.script else "ok"
        if how == "permanent":
            self.target.save(state)
            raise cp.PermanentError("rejected: quota")
        if how == "retryable":
            self.target.save(state)
            raise cp.RetryableError("busy, not done")
        if how == "timeout":  # nothing committed, but the caller cannot know
            self.target.save(state)
            raise TimeoutError("read timed out")
        record = state["records"].setdefault(
            key, {"id": f"rec-{len(state['records']) + 1}", "digest": call.intent_digest}
        )
        self.target.save(state)
        if how == "lost":  # committed, then the response was lost
            raise ConnectionResetError("connection reset by peer")
        return cp.Receipt(record["id"], {"id": record["id"]}, record["digest"])

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        state = self.target.state()
        key = call.operation_id
        state["lookups"][key] = state["lookups"].get(key, 0) + 1
        self.target.save(state)
        how = self.script.pop(0) if self.script else "ok"
        if how == "lookup-down":
            raise ConnectionRefusedError("lookup endpoint down")
        if how == "cannot-tell":
            raise cp.OutcomeUnknown("the audit log is behind")
        record = state["records"].get(key)
        if record is None:
            return None
        return cp.Receipt(record["id"], {"id": record["id"]}, record["digest"])


class BlindTool(TargetTool):
    name: ClassVar[str] = "blind"
    supports_lookup: ClassVar[bool] = False
