"""The request projection reuses a message's dump only while the message is unchanged:
it always equals the dump of the whole history, whatever was changed in place."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RequestUsage,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

import crashproof as cp
from crashproof.integrations.pydantic_ai._codec import Projection, _strip


def whole(messages: list[ModelMessage]) -> Any:
    return _strip(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))


def history(turns: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("fix the bug")])]
    for i in range(turns):
        messages.append(
            ModelResponse(
                parts=[ToolCallPart("add", {"x": i, "tags": ["a"]}, tool_call_id=f"c{i}")],
                usage=RequestUsage(input_tokens=10 * i, output_tokens=3),
                model_name="function:m",
            )
        )
        messages.append(ModelRequest(parts=[ToolReturnPart("add", i + 1, tool_call_id=f"c{i}")]))
    return messages


def test_a_growing_history_is_projected_as_dumped_whole() -> None:
    projection = Projection()
    messages = history(0)
    for i in range(6):
        assert projection.messages(messages) == whole(messages)
        messages = [*messages, *history(i + 1)[-2:]]


def change_parts_in_place(messages: list[ModelMessage]) -> None:
    messages[0].parts.append(UserPromptPart("and the docs"))  # type: ignore[attr-defined]


def reassign_parts(messages: list[ModelMessage]) -> None:
    messages[2].parts = [*messages[2].parts, UserPromptPart("more")]


def change_args_in_place(messages: list[ModelMessage]) -> None:
    part = messages[1].parts[0]
    assert isinstance(part, ToolCallPart)
    assert isinstance(part.args, dict)
    part.args["tags"].append("b")


def change_content(messages: list[ModelMessage]) -> None:
    response = messages[3]
    assert isinstance(response, ModelResponse)
    response.parts = [TextPart("a different answer")]


def set_instructions(messages: list[ModelMessage]) -> None:
    request = messages[0]
    assert isinstance(request, ModelRequest)
    request.instructions = "be brief"


@pytest.mark.parametrize(
    "change",
    [change_parts_in_place, reassign_parts, change_args_in_place, change_content, set_instructions],
)
def test_a_message_changed_after_it_was_sent_is_dumped_again(change: Any) -> None:
    projection = Projection()
    messages = history(3)
    before = projection.messages(messages)
    change(messages)
    after = projection.messages(messages)
    assert after == whole(messages)
    assert after != before


def test_a_new_object_with_the_same_content_is_dumped_anew() -> None:
    projection = Projection()
    first, second = history(2), history(2)
    assert projection.messages(first) == projection.messages(second) == whole(second)


def test_the_transcript_digests_as_the_plain_list_did() -> None:
    # Runs recorded when the projection was a plain list still match after an upgrade.
    from crashproof.journal.transcript import digest_v2

    projection = Projection()
    messages = history(4)
    projection.messages(messages[:3])
    projected = projection.messages(messages)
    assert isinstance(projected, cp.Transcript)
    plain = whole(messages)
    assert digest_v2((), {"messages": projected}) == digest_v2((), {"messages": plain})


def test_a_stamp_the_projection_leaves_out_keeps_the_prefix() -> None:
    projection = Projection()
    messages = history(3)
    first = projection.messages(messages)
    messages[1].run_id = "another run"  # pydantic-ai stamps a response after the hook
    assert projection.messages(messages) is first
