"""What every SDK mapping provides (``_openai.py``, ``_anthropic.py``): pure functions from
an SDK's request and response to what the recorder needs, no I/O. The sync and async
shells (``_recorder.py``) differ only in how they call and await the SDK."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from crashproof.models._pricing import Usage

__all__ = ["Api", "ToolCall", "dump", "revive"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a response: its position, the model's id for it, the tool's
    name and its arguments (JSON text from OpenAI, a parsed object from Anthropic)."""

    index: int
    id: str
    name: str
    arguments: Any


def dump(model: Any) -> dict[str, Any]:
    """An SDK object as the JSON the decision records. ``exclude_none``: a field the
    server left out or sent as null is None again when revived, so the round trip is
    exact for the SDKs' optional fields."""
    data: dict[str, Any] = model.model_dump(mode="json", exclude_none=True, warnings=False)
    return data


def revive(cls: Any, data: dict[str, Any]) -> Any:
    """``data`` (what ``dump`` recorded) as the SDK type ``cls``: validated by pydantic,
    else, when it does not fit the types this SDK version declares (a field a newer API
    added), built leniently as the SDK builds the responses it reads (``model_construct``).
    The same JSON always takes the same path, so the first run and a replay get the same
    object. Validation first because it is native code: 11 µs for a chat completion with
    a tool call, against 525 µs for ``model_construct`` (the SDK's Python walk over its
    types), which was nearly all of the recorder's cost per call (bench/models.py)."""
    try:
        return cls.model_validate(data)
    except ValueError:  # pydantic's ValidationError is a ValueError
        return cls.model_construct(**data)


class Api(Protocol):
    """One SDK endpoint, sans I/O."""

    label: str  # "openai.chat": what errors name
    provider: str  # gen_ai.provider.name of the OpenTelemetry GenAI conventions
    final: str  # the stream manager's method that assembles the final response

    def endpoint(self, client: Any) -> Any:
        """The object with ``create`` and ``stream`` (``client.chat.completions``)."""

    def stream_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request as sent when streamed (usage asked for where it must be)."""

    def revive(self, data: dict[str, Any]) -> Any:
        """The recorded JSON as the SDK's own response type."""

    def usage(self, reply: Any) -> tuple[str | None, Usage]:
        """The model that answered and the tokens it counted."""

    def tool_calls(self, reply: Any) -> list[ToolCall]:
        """The response's tool calls, in order."""

    def finish_reasons(self, reply: Any) -> list[str]:
        """Why the model stopped, per choice (``gen_ai.response.finish_reasons``)."""

    def schemas(self, tools: Any) -> dict[str, Any]:
        """Tool name -> the JSON schema of its arguments, from the request's ``tools``."""

    def tool_spec(self, tool: Any) -> dict[str, Any]:
        """A ``cp.models.tool`` function as this API's tool declaration (JSON)."""

    def reply_messages(self, reply: Any) -> list[dict[str, Any]]:
        """The response as the messages (input items) to append to the conversation."""

    def tool_results(self, results: list[tuple[ToolCall, str, bool]]) -> list[dict[str, Any]]:
        """Tool outputs (call, text, is_error) as the messages to append."""
