"""Regenerate the console screenshots of docs/console.md (not run in CI).

    .venv/bin/python bench/console_screenshots.py [--out docs/images]

Builds a ledger in a temporary directory with the runs the pictures show: an agent
whose model call goes through the real ``openai`` client to the examples' local model
server (a conversation with a tool call) and whose Workspace acts leave a diff; a forge
act whose lost answer is found bound to another intent (a review case, both sides); a
risky delete waiting for an approval. Serves the console over it on the loopback, as
the operator ``erin`` (a registered key made here), and takes full-page PNGs in
headless Chromium (Debian's ``chromium`` through Playwright, as tests/console does).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("CRASHPROOF_KEY", "42" * 32)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import openai
import uvicorn
from _model_server import ModelServer
from playwright.sync_api import sync_playwright

import crashproof as cp
from crashproof.console import ConsoleConfig, Signer, create_app
from crashproof.integrity.signing import generate_keypair, load_private_key

DIFF = (
    "--- a/flaky.py\n+++ b/flaky.py\n@@ -1,3 +1,3 @@\n"
    " def test_x():\n-    sleep(0.1)\n+    wait_for(ready)\n     assert ready\n"
)


class Forge(cp.Tool):
    """Its answer was lost, and its lookup finds a PR made for another intent."""

    name = "forge"
    version = "1"

    def execute(self, call: cp.Call) -> cp.Receipt:
        raise TimeoutError("the forge did not answer")

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        return cp.Receipt("pr-9", {"number": 9, "title": "bump deps"}, intent_digest="e" * 64)


def build(root: Path, model_url: str) -> tuple[cp.Ledger, Signer]:
    ledger = cp.Ledger(f"sqlite:///{root / 'runs.db'}")
    (root / "ws").mkdir()
    ws = cp.Workspace(root / "ws")
    client = openai.OpenAI(api_key="k", base_url=model_url + "/v1", timeout=10)

    @ledger.workflow("fix-flaky-test", version="1")
    def agent(ctx: cp.Context) -> str:
        llm = cp.models.openai_chat(ctx, client, name="chat")
        tool = {"name": "edit", "parameters": {"type": "object", "properties": {}}}
        llm.create(
            model="m",
            messages=[
                {"role": "system", "content": "You fix flaky tests."},
                {"role": "user", "content": "tests/flaky.py fails one run in ten"},
            ],
            tools=[{"type": "function", "function": tool}],
        )
        ctx.act(
            "write",
            ws,
            op="write",
            path="flaky.py",
            content="def test_x():\n    sleep(0.1)\n    assert ready\n",
        )
        ctx.act("patch", ws, op="patch", path="flaky.py", diff=DIFF)
        return "fixed"

    @ledger.workflow("open-pr", version="1")
    def forge(ctx: cp.Context) -> Any:
        return ctx.act("open-pr", Forge(), title="bump deps")

    (root / "ws" / "old.log").write_text("rotate me\n")
    policy = cp.Policy(
        "ops-1",
        allow={"workspace": "*"},
        risk={"workspace": lambda tool, params: "high" if params["op"] == "delete" else "low"},
        approval_required={"high"},
    )

    @ledger.workflow("cleanup", version="1")
    def cleanup(ctx: cp.Context) -> str:
        ctx.act("drop", ws, op="delete", path="old.log")
        return "cleaned"

    ledger.run(agent, run_id="fix-flaky-1")
    with contextlib.suppress(cp.RunFrozen):
        ledger.run(forge, run_id="open-pr-1")
    with contextlib.suppress(cp.RunFrozen):
        ledger.run(cleanup, run_id="cleanup-1", options=cp.RunOptions(policy=policy))
    key = root / "erin.pem"
    generate_keypair(key)
    ledger.add_approver("erin", key.with_name("erin.pem.pub").read_text(), by="root")
    return ledger, Signer(load_private_key(key), "erin")


@contextlib.contextmanager
def served(config: ConsoleConfig) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def chromium() -> str:
    found = os.environ.get("CRASHPROOF_CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )
    if found is None:
        raise SystemExit("no Chromium binary: apt-get install chromium, or set CRASHPROOF_CHROMIUM")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    turn = ("I will replace the sleep with a wait on <ready>.", [("edit", {"path": "flaky.py"})])
    with tempfile.TemporaryDirectory() as tmp:
        server = ModelServer([turn]).start()
        try:
            ledger, signer = build(Path(tmp), server.url)
        finally:
            server.stop()
        shots = {
            "console-run-conversation-diff.png": "/run?id=fix-flaky-1",
            "console-run-review-case.png": "/run?id=open-pr-1",
            "console-attention.png": "/attention",
        }
        with served(ConsoleConfig(ledger=ledger, signer=signer)) as url, sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium(), headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            tab = browser.new_page(viewport={"width": 1280, "height": 800}, base_url=url)
            for name, path in shots.items():
                tab.goto(path)
                tab.screenshot(path=str(args.out / name), full_page=True)
                print(f"{args.out / name}: {path}")
            browser.close()
        ledger.close()


if __name__ == "__main__":
    main()
