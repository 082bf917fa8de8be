"""The real ``openai`` and ``anthropic`` clients against ``model_server.ModelServer`` on
127.0.0.1, one helper per API so each test runs on all three."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anthropic
import openai

import crashproof as cp

FAST = cp.StepOptions(retry=cp.RetryPolicy(attempts=4, backoff=0.01, retry_on=(cp.Unavailable,)))


@dataclass(frozen=True)
class Api:
    """How a test asks each API the same question."""

    name: str

    def client(self, url: str, *, is_async: bool, timeout: float = 10.0) -> Any:
        if self.name == "anthropic":
            cls: Any = anthropic.AsyncAnthropic if is_async else anthropic.Anthropic
            return cls(api_key="k", base_url=url, timeout=timeout)
        cls = openai.AsyncOpenAI if is_async else openai.OpenAI
        return cls(api_key="k", base_url=url + "/v1", timeout=timeout)

    def bind(self, ctx: Any, client: Any, **kw: Any) -> Any:
        factory = {
            "chat": cp.models.openai_chat,
            "responses": cp.models.openai_responses,
            "anthropic": cp.models.anthropic_messages,
        }[self.name]
        return factory(ctx, client, **kw)

    def request(
        self, messages: list[Any], tools: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"model": "m"}
        if self.name == "responses":
            out["input"] = messages
        else:
            out["messages"] = messages
        if self.name == "anthropic":
            out["max_tokens"] = 64
        if tools:
            out["tools"] = [self.tool(t) for t in tools]
        return out

    def tool(self, spec: dict[str, Any]) -> dict[str, Any]:
        name, params = spec["name"], spec["parameters"]
        if self.name == "chat":
            return {"type": "function", "function": {"name": name, "parameters": params}}
        if self.name == "responses":
            return {"type": "function", "name": name, "parameters": params}
        return {"name": name, "input_schema": params}

    @property
    def reply_type(self) -> str:
        return {"chat": "ChatCompletion", "responses": "Response", "anthropic": "Message"}[
            self.name
        ]

    def text(self, reply: Any) -> str:
        if self.name == "chat":
            return str(reply.choices[0].message.content)
        if self.name == "responses":
            return str(reply.output_text)
        return str(reply.content[0].text)


APIS = [Api("chat"), Api("responses"), Api("anthropic")]
