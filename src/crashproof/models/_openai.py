"""OpenAI Chat Completions and Responses, sans I/O (the ``openai`` package is imported
only when a response is revived, never by ``import crashproof``)."""

from __future__ import annotations

from typing import Any

from crashproof.models._api import ToolCall, dump, revive
from crashproof.models._pricing import Usage

__all__ = ["CHAT", "RESPONSES"]


def _details(obj: Any, field: str) -> int:
    details = getattr(obj, field, None)
    return int(getattr(details, "cached_tokens", None) or 0)


class _Chat:
    label = "openai.chat"
    provider = "openai"
    final = "get_final_completion"

    def endpoint(self, client: Any) -> Any:
        return client.chat.completions

    def stream_request(self, request: dict[str, Any]) -> dict[str, Any]:
        # Without include_usage a streamed completion reports no tokens at all.
        options = {"include_usage": True, **(request.get("stream_options") or {})}
        return {**request, "stream_options": options}

    def revive(self, data: dict[str, Any]) -> Any:
        from openai.types.chat import ChatCompletion

        return revive(ChatCompletion, data)

    def usage(self, reply: Any) -> tuple[str | None, Usage]:
        u = reply.usage
        if u is None:
            return reply.model, Usage(input=0, output=0)
        cached = _details(u, "prompt_tokens_details")
        return reply.model, Usage(input=u.prompt_tokens, output=u.completion_tokens, cached=cached)

    def finish_reasons(self, reply: Any) -> list[str]:
        return [str(c.finish_reason) for c in reply.choices or () if c.finish_reason]

    def tool_calls(self, reply: Any) -> list[ToolCall]:
        if not reply.choices:
            return []
        calls = reply.choices[0].message.tool_calls or []
        out = []
        for i, call in enumerate(calls):
            function = getattr(call, "function", None)  # a custom tool call has none
            name = function.name if function is not None else getattr(call, "type", "?")
            arguments = function.arguments if function is not None else None
            out.append(ToolCall(i, call.id, name, arguments))
        return out

    def schemas(self, tools: Any) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for tool in tools or ():
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                found[function["name"]] = function.get("parameters")
        return found

    def tool_spec(self, tool: Any) -> dict[str, Any]:
        function = {"name": tool.name, "description": tool.description, "parameters": tool.schema}
        if not tool.description:
            del function["description"]
        return {"type": "function", "function": function}

    def reply_messages(self, reply: Any) -> list[dict[str, Any]]:
        if not reply.choices:
            return []
        message = dump(reply.choices[0].message)
        # Output-only fields the API refuses as input.
        for field in ("annotations", "audio", "refusal"):
            message.pop(field, None)
        for call in message.get("tool_calls", ()):
            call.pop("index", None)  # left by the stream helper's chunks
        return [message]

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": c.id, "content": text} for c, text, _ in results]


class _Responses:
    label = "openai.responses"
    provider = "openai"
    final = "get_final_response"

    def endpoint(self, client: Any) -> Any:
        return client.responses

    def stream_request(self, request: dict[str, Any]) -> dict[str, Any]:
        return request

    def revive(self, data: dict[str, Any]) -> Any:
        from openai.types.responses import Response

        return revive(Response, data)

    def usage(self, reply: Any) -> tuple[str | None, Usage]:
        u = reply.usage
        if u is None:
            return reply.model, Usage(input=0, output=0)
        cached = _details(u, "input_tokens_details")
        return reply.model, Usage(input=u.input_tokens, output=u.output_tokens, cached=cached)

    def finish_reasons(self, reply: Any) -> list[str]:
        # A response has one status (completed, incomplete, ...) and, when incomplete, why.
        details = getattr(reply, "incomplete_details", None)
        reason = getattr(details, "reason", None) or getattr(reply, "status", None)
        return [str(reason)] if reason else []

    def tool_calls(self, reply: Any) -> list[ToolCall]:
        items = [item for item in reply.output if item.type == "function_call"]
        return [
            ToolCall(i, item.call_id, item.name, item.arguments) for i, item in enumerate(items)
        ]

    def schemas(self, tools: Any) -> dict[str, Any]:
        return {
            tool["name"]: tool.get("parameters")
            for tool in tools or ()
            if isinstance(tool, dict)
            and tool.get("type") == "function"
            and isinstance(tool.get("name"), str)
        }

    def tool_spec(self, tool: Any) -> dict[str, Any]:
        # strict: the Responses API's default is true, which would make every parameter
        # required; the schema says which are.
        spec = {"type": "function", "name": tool.name, "description": tool.description}
        if not tool.description:
            del spec["description"]
        return {**spec, "parameters": tool.schema, "strict": False}

    def reply_messages(self, reply: Any) -> list[dict[str, Any]]:
        return [dump(item) for item in reply.output]

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict[str, Any]]:
        return [
            {"type": "function_call_output", "call_id": c.id, "output": text}
            for c, text, _ in results
        ]


CHAT = _Chat()
RESPONSES = _Responses()
