"""A child process for the model recorders' crash matrix: a small code agent on the real
``openai`` SDK against the test's model server: write a file (a workspace act), run a
check (a step), open a PR (an act with lookup), then finish.

Usage: python child_models.py URL DIR MODEL_URL SPEC   (SPEC: none | at:N), or
``main(URL, DIR, MODEL_URL, SPEC)`` in a process forked from a forkserver that has
imported the SDK already (what the crash matrix does).
The forge keeps its PRs in DIR/prs.json, so they survive SIGKILL.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import openai

import crashproof as cp

MESSAGES = [{"role": "user", "content": "fix the bug and open a PR"}]


class Forge(cp.Tool):
    name: ClassVar[str] = "forge"
    version: ClassVar[str] = "1"

    def __init__(self, path: Path) -> None:
        self.path = path

    def _prs(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}  # type: ignore[no-any-return]

    def execute(self, call: cp.Call) -> cp.Receipt:
        prs = self._prs()
        pr = prs.setdefault(call.operation_id, {"n": len(prs) + 1, "digest": call.intent_digest})
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps(prs))
        temp.replace(self.path)
        call.crash_point("opened")
        return cp.Receipt(str(pr["n"]), {"pr": pr["n"]}, pr["digest"])

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        pr = self._prs().get(call.operation_id)
        return None if pr is None else cp.Receipt(str(pr["n"]), {"pr": pr["n"]}, pr["digest"])


def make(ledger: cp.Ledger, directory: Path, model_url: str) -> cp.Workflow[Any]:
    ws = cp.Workspace(directory / "ws")
    forge = Forge(directory / "prs.json")
    client = openai.OpenAI(api_key="k", base_url=model_url + "/v1", timeout=10)

    def check(path: str) -> str:
        return f"{path}: {len((directory / 'ws' / path).read_text())} bytes"

    tools = {"write_file": ws, "check": check, "open_pr": forge}

    def agent(ctx: cp.Context) -> dict[str, Any]:
        llm = cp.models.openai_chat(ctx, client)
        messages: list[Any] = list(MESSAGES)
        while True:
            reply = llm.create(model="m", messages=messages)
            messages += llm.reply_messages(reply)
            results = llm.run_tools(reply, tools)
            if not results:
                break
            messages += results
        return {"fingerprint": ws.fingerprint(), "turns": len(messages)}

    return ledger.workflow("agent", version="1")(agent)


def main(url: str, directory: str, model_url: str, spec: str) -> None:
    points = cp.CrashPoints(at=int(spec[3:]), action="sigkill") if spec != "none" else None
    with cp.Ledger(url, crash_points=points) as ledger:
        ledger.run(make(ledger, Path(directory), model_url), run_id="a")


if __name__ == "__main__":
    main(*sys.argv[1:5])
