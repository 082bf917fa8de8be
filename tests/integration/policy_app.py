"""The app module of the worker-policy test (``crashproof worker --app policy_app
--policy policy_app:POLICY``): one workflow of acts through a tool that appends a line per
execute to ``$POLICY_LINES`` (so anything executed shows), and the policy its runs are
enqueued with: lines ``ok:*`` are allowed, ``risky:*`` need an approval, anything else
is out of scope."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp

LINES = Path(os.environ.get("POLICY_LINES", "policy-lines.txt"))


class Lines(cp.Tool):
    name: ClassVar[str] = "lines"
    version: ClassVar[str] = "1"

    def execute(self, call: cp.Call) -> cp.Receipt:
        with LINES.open("a", encoding="utf-8") as f:
            f.write(f"{call.run_id} {call.params['text']}\n")
        return cp.Receipt(call.operation_id, {"line": call.params["text"]}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        return None  # the test never crashes a worker mid-act


def _risk(tool: cp.Tool, params: dict[str, Any]) -> str:
    return "high" if str(params.get("text", "")).startswith("risky:") else "low"


POLICY = cp.Policy(
    "lines-2026-11",
    allow={"lines": "1"},
    scopes={"lines": {"text": ["ok:*", "risky:*"]}},
    risk={"lines": _risk},
    approval_required={"high"},
)
LIMITS = cp.Limits(max_steps=3)

lines_tool = Lines()


@cp.workflow("writes")
def writes(ctx: cp.Context, texts: list[str]) -> int:
    for text in texts:
        ctx.act("line", lines_tool, text=text)
    return len(texts)
