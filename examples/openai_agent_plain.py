"""The agent of ``openai_agent.py`` without crashproof: the same model server, script,
tools and forge, written as one would on the bare ``openai`` SDK. Nothing is durable: a
crash loses the conversation, a restart asks every decision again and re-applies what it
reaches (a second pull request, a second notification, a commit on top of the commit).

It is here to be compared with: ``tests/verify/test_openai_agent.py`` runs both against
the same servers (the same artifacts) and counts the lines of the two workflow functions.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai

from ._forge import Forge
from .openai_agent import MODEL, SYSTEM, TOOLS, run_tests


class Tools:
    """The agent's tools, by hand: files, the tests, git, the forge."""

    def __init__(self, repo: Path, forge: Forge, http: httpx.Client) -> None:
        self.repo, self.forge, self.http = repo, forge, http

    def read_file(self, path: str) -> str:
        return (self.repo / path).read_text(encoding="utf-8")

    def edit_file(
        self, op: str, path: str, content: str = "", text: str = "", diff: str = ""
    ) -> str:
        target = self.repo / path
        if op == "patch":
            subprocess.run(["git", "apply", "-"], cwd=self.repo, input=diff, text=True, check=True)
        elif op == "append":
            target.write_text(target.read_text() + text)
        else:
            target.write_text(content)
        return f"{op} {path}: done"

    def run_tests(self) -> str:
        return run_tests(self.repo)

    def git(self, op: str, message: str = "", paths: tuple[str, ...] = (), name: str = "") -> str:
        identity = ["-c", "user.name=crashproof", "-c", "user.email=crashproof@localhost"]
        if op == "commit":
            subprocess.run(["git", "add", "--", *paths], cwd=self.repo, check=True)
            subprocess.run(
                ["git", *identity, "commit", "-q", "-m", message], cwd=self.repo, check=True
            )
        else:
            subprocess.run(["git", "branch", name], cwd=self.repo, check=True)
        return f"git {op}: done"

    def _post(self, path: str, body: Any) -> dict[str, Any]:
        key = uuid.uuid4().hex  # no stable key to give: every attempt is a new request
        headers = {"Idempotency-Key": key, "Crashproof-Intent-Digest": key}
        answer = self.http.post(f"{self.forge.url}{path}", json=body, headers=headers)
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result

    def open_pr(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._post("/repos/greeter/pulls", body)

    def notify(self, channel: str, text: str) -> dict[str, Any]:
        return self._post("/notifications", {"channel": channel, "text": text})


def agent(client: openai.OpenAI, tools: Tools, task: str) -> int:
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    while True:
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(mode="json", exclude_none=True))
        if not message.tool_calls:
            return len(messages)
        for call in message.tool_calls:
            try:
                handler = getattr(tools, call.function.name)
                output = handler(**json.loads(call.function.arguments))
            except Exception as exc:  # the model reads the error
                output = f"error: {exc}"
            content = output if isinstance(output, str) else json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
