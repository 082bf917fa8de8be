"""Anthropic Messages, sans I/O (``anthropic`` is imported only to revive a response)."""

from __future__ import annotations

from typing import Any

from crashproof.models._api import ToolCall, dump, revive
from crashproof.models._pricing import Usage

__all__ = ["MESSAGES"]


class _Messages:
    label = "anthropic.messages"
    provider = "anthropic"
    final = "get_final_message"

    def endpoint(self, client: Any) -> Any:
        return client.messages

    def stream_request(self, request: dict[str, Any]) -> dict[str, Any]:
        return request

    def revive(self, data: dict[str, Any]) -> Any:
        from anthropic.types import Message

        return revive(Message, data)

    def finish_reasons(self, reply: Any) -> list[str]:
        reason = getattr(reply, "stop_reason", None)
        return [str(reason)] if reason else []

    def usage(self, reply: Any) -> tuple[str | None, Usage]:
        u = reply.usage
        read = int(getattr(u, "cache_read_input_tokens", None) or 0)
        write = int(getattr(u, "cache_creation_input_tokens", None) or 0)
        # Anthropic's input_tokens leaves the cache out: counted in, as OpenAI does.
        usage = Usage(
            input=u.input_tokens + read + write,
            output=u.output_tokens,
            cached=read,
            cache_write=write,
        )
        return reply.model, usage

    def tool_calls(self, reply: Any) -> list[ToolCall]:
        blocks = [block for block in reply.content if block.type == "tool_use"]
        return [ToolCall(i, b.id, b.name, b.input) for i, b in enumerate(blocks)]

    def schemas(self, tools: Any) -> dict[str, Any]:
        return {
            tool["name"]: tool.get("input_schema")
            for tool in tools or ()
            if isinstance(tool, dict) and isinstance(tool.get("name"), str)
        }

    def tool_spec(self, tool: Any) -> dict[str, Any]:
        spec = {"name": tool.name, "description": tool.description, "input_schema": tool.schema}
        if not tool.description:
            del spec["description"]
        return spec

    def reply_messages(self, reply: Any) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": [dump(block) for block in reply.content]}]

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict[str, Any]]:
        if not results:
            return []
        blocks: list[dict[str, Any]] = []
        for call, text, is_error in results:
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call.id, "content": text}
            if is_error:
                block["is_error"] = True
            blocks.append(block)
        return [{"role": "user", "content": blocks}]


MESSAGES = _Messages()
