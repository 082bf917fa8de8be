"""A small model server on 127.0.0.1 that speaks the OpenAI (Chat Completions,
Responses) and Anthropic (Messages) wire protocols: JSON answers and SSE streams over
chunked HTTP/1.1, with tool calls, and the faults a real API shows (429 with
Retry-After, 500, a connection dropped mid-stream, an answer slower than the client's
timeout). It plays a script of turns and counts the requests it gets, so a decision
asked again shows; every answer carries a fresh nonce.

Used by the tests and the crash matrix's child; not a mock of crashproof: the real
``openai`` and ``anthropic`` clients talk to it over a socket.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Fault", "ModelServer", "Turn"]


@dataclass(frozen=True)
class Turn:
    """One scripted answer: text, and tool calls as (name, arguments JSON text)."""

    text: str = ""
    calls: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Fault:
    """Instead of an answer: ``status`` (with ``retry_after``), ``drop`` (a stream cut
    after its first event, or a JSON answer cut mid-body) or ``slow`` (seconds)."""

    status: int = 0
    retry_after: str | None = None
    drop: bool = False
    slow: float = 0.0


@dataclass
class ModelServer:
    script: list[Turn | Fault] = field(default_factory=list)
    # Answer by the conversation's position (its assistant messages so far) rather than
    # by the script's: a crash matrix's resumed child asking turn k again gets turn k.
    by_turn: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    # 0: any free port; a given one lets a server stopped for an outage come back at the
    # same URL (the fleet test).
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                except ValueError:  # the client died mid-request (a SIGKILL): no answer
                    self.close_connection = True
                    return
                if server._stopped:  # a kept-alive connection outlives the listener: cut it
                    self.close_connection = True
                    return
                server._serve(self, body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        # A client SIGKILLed mid-connection resets it: expected here, not worth a traceback.
        self._httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._position = 0
        self._stopped = False

    def __enter__(self) -> ModelServer:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped = True  # down for every client, those with an open connection too
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def count(self) -> int:
        return len(self.requests)

    def _next(self, body: dict[str, Any]) -> Turn | Fault:
        with self._lock:
            if self.by_turn:
                # Chat and Messages: assistant messages; Responses: the model's turns.
                turn = sum(1 for m in body.get("messages", ()) if m.get("role") == "assistant")
                if "input" in body and isinstance(body["input"], list):
                    turn = _responses_turns(body["input"])
                return self.script[turn] if turn < len(self.script) else Fault(status=400)
            if self._position >= len(self.script):
                return Fault(status=400)
            item = self.script[self._position]
            self._position += 1
            return item

    def _serve(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        path = handler.path
        with self._lock:
            self.requests.append({"path": path, "body": body, "at": time.time()})
        item = self._next(body)
        stream = bool(body.get("stream"))
        if isinstance(item, Fault):
            if item.slow:
                time.sleep(item.slow)
            elif item.status:
                headers = {"retry-after": item.retry_after} if item.retry_after else {}
                error = {"error": {"type": "server_error", "message": f"scripted {item.status}"}}
                if item.status == 400:
                    error = {"error": {"type": "invalid_request_error", "message": "no more turns"}}
                _send_json(handler, item.status, error, headers)
                return
        turn = item if isinstance(item, Turn) else Turn(text="late")
        nonce = uuid.uuid4().hex[:12]
        render = _RENDER[_api(path)]
        if not stream:
            payload = render.whole(turn, nonce, body)
            if isinstance(item, Fault) and item.drop:
                _drop_json(handler, payload)
                return
            _send_json(handler, 200, payload, {})
            return
        events = render.events(turn, nonce, body)
        _send_sse(handler, events, drop=isinstance(item, Fault) and item.drop)


def _api(path: str) -> str:
    for name in ("chat/completions", "responses", "messages"):
        if path.rstrip("/").endswith(name):
            return name
    raise ValueError(path)


def _send_json(
    h: BaseHTTPRequestHandler, status: int, payload: Any, headers: dict[str, str]
) -> None:
    data = json.dumps(payload).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for k, v in headers.items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def _drop_json(h: BaseHTTPRequestHandler, payload: Any) -> None:
    data = json.dumps(payload).encode()
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data[: len(data) // 2])
    h.wfile.flush()
    h.connection.shutdown(socket.SHUT_RDWR)
    h.close_connection = True


def _send_sse(
    h: BaseHTTPRequestHandler, events: Iterator[tuple[str | None, Any]], *, drop: bool
) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for n, (name, data) in enumerate(events):
        text = data if isinstance(data, str) else json.dumps(data)
        frame = (f"event: {name}\n" if name else "") + f"data: {text}\n\n"
        raw = frame.encode()
        try:
            h.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            h.wfile.flush()
        except OSError:  # the client went away mid-stream (it crashed, or gave up)
            h.close_connection = True
            return
        if drop and n == 1:  # cut mid-stream: no terminating chunk, the socket closed
            h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
            return
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()


def _usage_numbers(body: dict[str, Any]) -> tuple[int, int]:
    return len(json.dumps(body)) // 4, 7


class _Chat:
    def whole(self, turn: Turn, nonce: str, body: dict[str, Any]) -> dict[str, Any]:
        inp, out = _usage_numbers(body)
        message: dict[str, Any] = {"role": "assistant", "content": f"{turn.text} [{nonce}]"}
        if turn.calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{nonce}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
                for i, (name, args) in enumerate(turn.calls)
            ]
        return {
            "id": f"chatcmpl-{nonce}",
            "object": "chat.completion",
            "created": 1700000000,
            "model": f"{body['model']}-2026-01-01",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if turn.calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": inp,
                "completion_tokens": out,
                "total_tokens": inp + out,
                "prompt_tokens_details": {"cached_tokens": 3},
            },
        }

    def events(
        self, turn: Turn, nonce: str, body: dict[str, Any]
    ) -> Iterator[tuple[str | None, Any]]:
        whole = self.whole(turn, nonce, body)
        base = {k: whole[k] for k in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield None, chunk({"role": "assistant", "content": ""})
        text = whole["choices"][0]["message"]["content"]
        for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
            yield None, chunk({"content": piece})
        for i, call in enumerate(whole["choices"][0]["message"].get("tool_calls", [])):
            yield (
                None,
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                ),
            )
            yield (
                None,
                chunk(
                    {
                        "tool_calls": [
                            {"index": i, "function": {"arguments": call["function"]["arguments"]}}
                        ]
                    }
                ),
            )
        yield None, chunk({}, whole["choices"][0]["finish_reason"])
        if (body.get("stream_options") or {}).get("include_usage"):
            yield None, base | {"choices": [], "usage": whole["usage"]}
        yield None, "[DONE]"


class _Responses:
    def whole(self, turn: Turn, nonce: str, body: dict[str, Any]) -> dict[str, Any]:
        inp, out = _usage_numbers(body)
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": f"msg_{nonce}",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": f"{turn.text} [{nonce}]", "annotations": []}
                ],
            }
        ]
        for i, (name, args) in enumerate(turn.calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{nonce}_{i}",
                    "call_id": f"call_{nonce}_{i}",
                    "name": name,
                    "arguments": args,
                    "status": "completed",
                }
            )
        return {
            "id": f"resp_{nonce}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": f"{body['model']}-2026-01-01",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": inp,
                "output_tokens": out,
                "total_tokens": inp + out,
                "input_tokens_details": {"cached_tokens": 2},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    def events(
        self, turn: Turn, nonce: str, body: dict[str, Any]
    ) -> Iterator[tuple[str | None, Any]]:
        whole = self.whole(turn, nonce, body)
        seq = iter(range(1000))
        start = whole | {"status": "in_progress", "output": [], "usage": None}
        yield (
            "response.created",
            {"type": "response.created", "response": start, "sequence_number": next(seq)},
        )
        for index, item in enumerate(whole["output"]):
            empty = dict(item)
            if item["type"] == "message":
                empty["content"] = []
                empty["status"] = "in_progress"
            yield (
                "response.output_item.added",
                {
                    "type": "response.output_item.added",
                    "item": empty,
                    "output_index": index,
                    "sequence_number": next(seq),
                },
            )
            if item["type"] == "message":
                part = {"type": "output_text", "text": "", "annotations": []}
                yield (
                    "response.content_part.added",
                    {
                        "type": "response.content_part.added",
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "part": part,
                        "sequence_number": next(seq),
                    },
                )
                text = item["content"][0]["text"]
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    yield (
                        "response.output_text.delta",
                        {
                            "type": "response.output_text.delta",
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "delta": piece,
                            "logprobs": [],
                            "sequence_number": next(seq),
                        },
                    )
            yield (
                "response.output_item.done",
                {
                    "type": "response.output_item.done",
                    "item": item,
                    "output_index": index,
                    "sequence_number": next(seq),
                },
            )
        yield (
            "response.completed",
            {"type": "response.completed", "response": whole, "sequence_number": next(seq)},
        )


def _responses_turns(items: list[Any]) -> int:
    """The model's earlier turns in a Responses ``input``: each a run of its output items
    (assistant messages, function calls) between the caller's items."""
    turns, in_turn = 0, False
    for item in items:
        ours = isinstance(item, dict) and (
            item.get("type") == "function_call" or item.get("role") == "assistant"
        )
        turns += ours and not in_turn
        in_turn = ours
    return turns


def _input(args: str) -> Any:
    """Anthropic sends parsed input: text that is no JSON goes as a string instead."""
    try:
        return json.loads(args)
    except json.JSONDecodeError:
        return args


class _Messages:
    def whole(self, turn: Turn, nonce: str, body: dict[str, Any]) -> dict[str, Any]:
        inp, out = _usage_numbers(body)
        content: list[dict[str, Any]] = [{"type": "text", "text": f"{turn.text} [{nonce}]"}]
        for i, (name, args) in enumerate(turn.calls):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{nonce}_{i}",
                    "name": name,
                    "input": _input(args),
                }
            )
        return {
            "id": f"msg_{nonce}",
            "type": "message",
            "role": "assistant",
            "model": f"{body['model']}-20260101",
            "content": content,
            "stop_reason": "tool_use" if turn.calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": inp,
                "output_tokens": out,
                "cache_read_input_tokens": 4,
                "cache_creation_input_tokens": 0,
            },
        }

    def events(
        self, turn: Turn, nonce: str, body: dict[str, Any]
    ) -> Iterator[tuple[str | None, Any]]:
        whole = self.whole(turn, nonce, body)
        start = whole | {
            "content": [],
            "stop_reason": None,
            "usage": whole["usage"] | {"output_tokens": 1},
        }
        yield "message_start", {"type": "message_start", "message": start}
        for i, block in enumerate(whole["content"]):
            if block["type"] == "text":
                yield (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                text = block["text"]
                for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                    yield (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "text_delta", "text": piece},
                        },
                    )
            else:
                yield (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": block | {"input": {}},
                    },
                )
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {
                            "type": "input_json_delta",
                            "partial_json": json.dumps(block["input"]),
                        },
                    },
                )
            yield "content_block_stop", {"type": "content_block_stop", "index": i}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": whole["usage"]["output_tokens"]},
            },
        )
        yield "message_stop", {"type": "message_stop"}


_RENDER: dict[str, Any] = {
    "chat/completions": _Chat(),
    "responses": _Responses(),
    "messages": _Messages(),
}
