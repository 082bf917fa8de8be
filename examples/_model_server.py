"""A local model server for the examples: the OpenAI Chat Completions (``POST
/v1/chat/completions``) and Anthropic Messages (``POST /v1/messages``) wire protocols,
JSON answers, on 127.0.0.1, playing a scripted conversation, so the official ``openai``
and ``anthropic`` clients talk to it over a real socket.

``ModelServer(script, log=path).start()``; ``url`` is the ``base_url`` to give the
``openai`` client, ``root`` the one to give the ``anthropic`` client.

- It answers by the conversation's position, not by arrival: a request whose ``messages``
  hold k assistant messages gets ``script[k]`` (text, and tool calls as
  ``(name, arguments)``), so a process that resumes and asks turn k again gets turn k again;
  past the script, a 400 (a bad request, as a real API says).
- Every answer carries a fresh random nonce in its text and its tool-call ids: a decision
  asked again would show, as a real model's answer would differ.
- It counts the requests per turn, by the decision key crashproof gives that turn
  (``chat``, ``chat#2``, ... for Chat Completions; ``message``, ``message#2``, ... for
  Messages), in the JSON file ``log``, replaced atomically before the
  answer leaves: a client killed after reading it still finds the call counted.
  ``calls()`` reads it back (the verifier's ``model_calls``).
- ``key``: the decision key's stem when a framework names its decisions
  (``coder:model_request`` for pydantic-ai, ``coder:model`` for the Agents SDK), in
  place of ``chat`` / ``message``.
- ``delay`` (seconds): how long each answer takes (the benchmark's 1 ms and 50 ms).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["ModelServer", "Turn", "turn_key"]

# One scripted answer: its text, and its tool calls as (tool name, arguments).
Turn = tuple[str, list[tuple[str, dict[str, Any]]]]


def turn_key(k: int, name: str = "chat") -> str:
    """The decision key of turn ``k`` (0-based) of a recorder named ``name`` (``chat``
    for Chat Completions, ``message`` for Anthropic Messages)."""
    return name if k == 0 else f"{name}#{k + 1}"


class ModelServer:
    """See the module docstring. ``start()`` / ``stop()``."""

    def __init__(
        self,
        script: list[Turn],
        log: Path | None = None,
        delay: float = 0.0,
        port: int = 0,
        key: str = "",
    ) -> None:
        self.script = script
        self.port = port  # 0: any free port
        self.key = key
        self.log = log
        self.delay = delay
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> ModelServer:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        server.daemon_threads = True
        server.model = self  # type: ignore[attr-defined]
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the model server is not started")
        return f"{self.root}/v1"

    @property
    def root(self) -> str:
        """The ``base_url`` of the ``anthropic`` client (it adds ``/v1/messages``)."""
        if self._server is None:
            raise RuntimeError("the model server is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def calls(self) -> dict[str, int]:
        """Requests per decision key, from the log."""
        if self.log is None or not self.log.exists():
            return {}
        counts: dict[str, int] = json.loads(self.log.read_text(encoding="utf-8"))
        return counts

    def _count(self, key: str) -> None:
        if self.log is None:
            return
        with self._lock:
            counts = self.calls()
            counts[key] = counts.get(key, 0) + 1
            temp = self.log.with_name(self.log.name + ".tmp")
            temp.write_text(json.dumps(counts, sort_keys=True), encoding="utf-8")
            os.replace(temp, self.log)

    def _turn(self, body: dict[str, Any], name: str) -> int:
        turn = sum(1 for m in body.get("messages", ()) if m.get("role") == "assistant")
        self._count(turn_key(turn, self.key or name))
        if self.delay:
            time.sleep(self.delay)
        return turn

    def answer_messages(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The status and JSON answer to one Anthropic Messages request."""
        turn = self._turn(body, "message")
        if turn >= len(self.script):
            error = {"type": "invalid_request_error", "message": "the script has no more turns"}
            return 400, {"type": "error", "error": error}
        text, calls = self.script[turn]
        nonce = uuid.uuid4().hex[:12]
        content: list[dict[str, Any]] = [{"type": "text", "text": f"{text} [{nonce}]"}]
        content += [
            {"type": "tool_use", "id": f"toolu_{nonce}_{i}", "name": name, "input": arguments}
            for i, (name, arguments) in enumerate(calls)
        ]
        return 200, {
            "id": f"msg_{nonce}",
            "type": "message",
            "role": "assistant",
            "model": f"{body['model']}-20260101",
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": len(json.dumps(body["messages"])) // 4, "output_tokens": 20},
        }

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The status and JSON answer to one Chat Completions request."""
        turn = self._turn(body, "chat")
        if turn >= len(self.script):
            error = {"message": "the script has no more turns", "type": "invalid_request_error"}
            return 400, {"error": error}
        text, calls = self.script[turn]
        nonce = uuid.uuid4().hex[:12]
        message: dict[str, Any] = {"role": "assistant", "content": f"{text} [{nonce}]"}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{nonce}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for i, (name, arguments) in enumerate(calls)
            ]
        prompt = len(json.dumps(body["messages"])) // 4  # a token is about 4 bytes
        return 200, {
            "id": f"chatcmpl-{nonce}",
            "object": "chat.completion",
            "created": 1767225600,
            "model": f"{body['model']}-2026-01-01",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 20,
                "total_tokens": prompt + 20,
            },
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects
    # The head and the body leave in two writes: with Nagle's algorithm the body waits for
    # the client's delayed ACK of the head, 40 ms per answer on Linux.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path.rstrip("/").endswith("/chat/completions"):
            status, payload = self.server.model.answer(body)  # type: ignore[attr-defined]
        elif self.path.rstrip("/").endswith("/v1/messages"):
            status, payload = self.server.model.answer_messages(body)  # type: ignore[attr-defined]
        else:
            status, payload = 404, {"error": {"message": f"no route {self.path}"}}
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away (it crashed)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        return None


if __name__ == "__main__":  # the tutorial's server: python -m examples._model_server
    import argparse

    parser = argparse.ArgumentParser(description="A local model server for the tutorial.")
    parser.add_argument("--port", type=int, default=8911)
    parser.add_argument("--log", type=Path, default=None, help="requests per turn, as JSON")
    options = parser.parse_args()
    # Every position answers with text: the tutorial's agent asks one question per note.
    server = ModelServer([("A short note, as asked.", [])] * 64, log=options.log, port=options.port)
    print(f"export OPENAI_BASE_URL={server.start().url} OPENAI_API_KEY=local", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
