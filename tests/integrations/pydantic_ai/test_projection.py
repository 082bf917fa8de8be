"""The request projection reuses a message's dump only while the message is unchanged:
it always equals the dump of the whole history, whatever was changed in place."""

from __future__ import annotations

import copy
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
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

import crashproof as cp
from crashproof.integrations.pydantic_ai._codec import Projection, _strip, decision_value, revive


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


def test_a_part_replaced_by_an_equal_one_is_watched_in_its_place() -> None:
    # The equal copy leaves the projection as it was; a change made to it later, in
    # place, is seen: the proof watches the objects sent, not the ones they replaced.
    projection = Projection()
    messages = history(2)
    before = projection.messages(messages)
    response = messages[1]
    assert isinstance(response, ModelResponse)
    response.parts[0] = copy.deepcopy(response.parts[0])
    assert projection.messages(messages) == before == whole(messages)
    part = response.parts[0]
    assert isinstance(part, ToolCallPart)
    assert isinstance(part.args, dict)
    part.args["x"] = 99
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


RESPONSES = [
    ModelResponse(parts=[ToolCallPart("add", {"x": 1, "tags": ["a"]}, tool_call_id="c1")]),
    ModelResponse(parts=[ToolCallPart("add", '{"x": 1}', tool_call_id="c2")]),
    ModelResponse(
        parts=[ThinkingPart("hmm", signature="s"), TextPart("done")],
        usage=RequestUsage(input_tokens=7, output_tokens=2, details={"reasoning_tokens": 1}),
        model_name="function:m",
        provider_name="p",
        provider_details={"finish": "stop"},
        provider_response_id="r1",
        finish_reason="stop",
    ),
]


@pytest.mark.parametrize("response", RESPONSES)
def test_an_answer_is_projected_from_its_recorded_value(response: ModelResponse) -> None:
    # The value is what the journal holds: the answer revived from it dumps as it again,
    # so projecting the value is projecting the message pydantic-ai sends next.
    value = decision_value(response)
    assert value == ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    revived = revive(value)
    assert _strip(decision_value(revived)) == _strip(value)
    projection = Projection()
    messages = history(2)
    projection.messages(messages)
    projection.answered(len(messages), revived, value)
    revived.run_id = "stamped after the hook"  # left out: the projection is kept
    messages = [*messages, revived, ModelRequest(parts=[UserPromptPart("next")])]
    assert projection.messages(messages) == whole(messages)


def test_an_answer_changed_before_it_is_sent_is_dumped_anew() -> None:
    projection = Projection()
    messages = history(1)
    projection.messages(messages)
    value = decision_value(RESPONSES[0])
    revived = revive(value)
    projection.answered(len(messages), revived, value)
    revived.parts = [TextPart("another answer")]
    messages = [*messages, revived]
    assert projection.messages(messages) == whole(messages)
    other = revive(value)  # not the object answered: dumped anew
    assert projection.messages([*messages[:-1], other]) == whole([*messages[:-1], other])


def test_an_answer_to_other_messages_is_not_kept() -> None:
    projection = Projection()
    messages = history(1)
    projection.messages(messages)
    value = decision_value(RESPONSES[1])
    projection.answered(len(messages) - 1, revive(value), value)  # not what was projected
    messages = [*messages, revive(value)]
    assert projection.messages(messages) == whole(messages)
