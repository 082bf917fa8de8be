"""The agent of ``openai_agent.py`` without crashproof: the same model server, script,
tools and forge, written as a careful agent on the bare ``openai`` SDK is: its tools'
JSON schemas by hand, the SDK's retries on 408/409/429/5xx raised to 5 (with its
backoff), and a tool's error (an unknown tool, bad arguments, a failed command) sent to
the model as the tool's message. Nothing is durable: a crash loses the conversation, a
restart asks every decision again and re-applies what it reaches (a second pull
request, a second notification, a commit on top of the commit).

It is here to be compared with: ``tests/verify/test_openai_agent.py`` runs both against
the same servers (the same artifacts, the same tool schemas) and ``bench/loc.py`` counts
the lines of both.
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
from .openai_agent import MODEL, SYSTEM, run_tests_in


def _function(name: str, description: str, **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    parameters = {**schema, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


_TEXT = {"type": "string"}
TOOLS = [
    _function("read_file", "Read a file of the repository.", path=_TEXT),
    _function("apply_patch", "Apply a unified diff to a file.", path=_TEXT, diff=_TEXT),
    _function("run_tests", "Run the repository's tests."),
    _function(
        "commit",
        "Commit files with a message.",
        message=_TEXT,
        paths={"type": "array", "items": _TEXT},
    ),
    _function(
        "create_pull_request",
        "Push the last commit to a new branch and open a pull request for it.",
        title=_TEXT,
        branch=_TEXT,
    ),
    _function("notify", "Post a message to a channel.", channel=_TEXT, text=_TEXT),
]


class Tools:
    """The agent's tools, by hand: files, the tests, git, the forge."""

    def __init__(self, repo: Path, forge: Forge, http: httpx.Client) -> None:
        self.repo, self.forge, self.http = repo, forge, http

    def read_file(self, path: str) -> str:
        return (self.repo / path).read_text(encoding="utf-8")

    def apply_patch(self, path: str, diff: str) -> str:
        subprocess.run(["git", "apply", "-"], cwd=self.repo, input=diff, text=True, check=True)
        return f"patched {path}"

    def run_tests(self) -> str:
        return run_tests_in(self.repo)

    def commit(self, message: str, paths: list[str]) -> str:
        identity = ["-c", "user.name=crashproof", "-c", "user.email=crashproof@localhost"]
        subprocess.run(["git", "add", "--", *paths], cwd=self.repo, check=True)
        subprocess.run(["git", *identity, "commit", "-q", "-m", message], cwd=self.repo, check=True)
        return "committed"

    def _post(self, path: str, body: Any) -> dict[str, Any]:
        key = uuid.uuid4().hex  # no stable key to give: every attempt is a new request
        headers = {"Idempotency-Key": key, "Crashproof-Intent-Digest": key}
        answer = self.http.post(f"{self.forge.url}{path}", json=body, headers=headers)
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result

    def create_pull_request(self, title: str, branch: str) -> dict[str, Any]:
        subprocess.run(["git", "branch", branch], cwd=self.repo, check=True)
        pull = {"title": title, "head": branch, "base": "main"}
        return self._post("/repos/greeter/pulls", pull)

    def notify(self, channel: str, text: str) -> dict[str, Any]:
        return self._post("/notifications", {"channel": channel, "text": text})

    def call(self, name: str, arguments: str | dict[str, Any]) -> str:
        """A tool call's output, or its error, as the text the model reads."""
        try:
            if name not in {tool["function"]["name"] for tool in TOOLS}:
                raise LookupError(f"there is no tool named {name!r}")
            if isinstance(arguments, str):  # OpenAI sends JSON text, Anthropic an object
                arguments = json.loads(arguments or "{}")
            output = getattr(self, name)(**arguments)
        except Exception as exc:  # the model reads the error
            return f"error: {type(exc).__name__}: {exc}"
        return output if isinstance(output, str) else json.dumps(output)


def agent(client: openai.OpenAI, tools: Tools, task: str) -> int:
    client = client.with_options(max_retries=5)  # 408, 409, 429, 5xx: with backoff
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    while True:
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(mode="json", exclude_none=True))
        if not message.tool_calls:
            return len(messages)
        for call in message.tool_calls:
            content = tools.call(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
