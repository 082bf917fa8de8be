"""What a CrashproofSaver remembers of its own writes never hides a change: a message
changed in place is stored changed, a replaced one is stored again, a value read back
through the writer's memory equals what a fresh saver reads from the database, and the
fast decoder reads what the walk reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint

from crashproof.integrations.langgraph import CrashproofSaver
from crashproof.integrations.langgraph._serde import _from_json, decode, encode

THREAD = "t1"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


class _Thread:
    """Puts of one growing ``messages`` channel, each a new version on the last."""

    def __init__(self, saver: CrashproofSaver) -> None:
        self.saver = saver
        self.config: Any = {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}
        self.version: str | None = None

    def put(self, messages: list[Any]) -> Any:
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"] = {"messages": self.version}
        self.config = self.saver.put(
            self.config, checkpoint, {"source": "loop", "step": 0}, {"messages": self.version}
        )
        return self.config


def _read(saver: CrashproofSaver, config: Any) -> list[Any]:
    got = saver.get_tuple(config)
    assert got is not None
    return list(got.checkpoint["channel_values"]["messages"])


def _transcript() -> list[Any]:
    return [
        HumanMessage("plan the upgrade", id="h1"),
        AIMessage(
            "",
            id="a1",
            tool_calls=[{"name": "scan", "args": {"paths": ["a", "b"]}, "id": "c1"}],
        ),
        ToolMessage("2 files", tool_call_id="c1", id="t1"),
    ]


def test_a_message_changed_in_place_is_stored_changed(url: str) -> None:
    with CrashproofSaver(url) as saver:
        thread = _Thread(saver)
        messages = _transcript()
        thread.put(messages)
        messages[0].additional_kwargs["note"] = "edited in place"  # nested, same object
        messages[2].content = "3 files"  # an attribute set again
        messages.append(AIMessage("done", id="a2"))
        last = thread.put(messages)
    with CrashproofSaver(url) as fresh:
        got = _read(fresh, last)
    assert got[0].additional_kwargs == {"note": "edited in place"}
    assert got[2].content == "3 files"
    assert got == messages


def test_objects_read_back_are_fresh_and_their_changes_stored(url: str) -> None:
    with CrashproofSaver(url) as saver:
        thread = _Thread(saver)
        thread.put(_transcript())
        first = _read(saver, thread.config)  # through the writer's memory
        again = _read(saver, thread.config)
        assert first == again
        assert first[1] is not again[1]
        first[1].tool_calls[0]["args"]["paths"].append("c")  # changes first's only
        assert again[1].tool_calls[0]["args"]["paths"] == ["a", "b"]
        first.append(HumanMessage("and c", id="h2"))
        last = thread.put(first)
    with CrashproofSaver(url) as fresh:
        assert _read(fresh, last) == first


def test_a_replaced_message_is_stored_again(url: str) -> None:
    with CrashproofSaver(url) as saver:
        thread = _Thread(saver)
        messages = _transcript()
        thread.put(messages)
        messages[1] = AIMessage("no tools after all", id="a1")  # add_messages' replace
        last = thread.put(messages)
        mine = _read(saver, last)
    with CrashproofSaver(url) as fresh:
        assert _read(fresh, last) == mine == messages


def test_the_writers_memory_reads_what_the_database_holds(url: str) -> None:
    values: list[Any] = [
        *_transcript(),
        ("a", 1),
        b"\x00\xff",
        {"__cp__": "message", "nested": [(1, 2)]},  # a user's dict holding the tag key
        "plain",
    ]
    with CrashproofSaver(url) as saver:
        thread = _Thread(saver)
        thread.put(values[:3])
        last = thread.put(values)
        mine = _read(saver, last)
    with CrashproofSaver(url) as fresh:
        theirs = _read(fresh, last)
    assert mine == theirs == values


@pytest.mark.parametrize(
    "value",
    [
        [HumanMessage("hi", id="1"), ("x", b"y"), {"k": [1.5, None, True]}],
        {"__cp__": "dict", "items": {"__cp__": 1}},
        {"outer": {"__cp__": "tuple"}, "m": AIMessage("a", id="2")},
    ],
)
def test_the_fast_decoder_reads_what_the_walk_reads(value: Any) -> None:
    text = encode(value, "a test value")
    assert decode(text) == _from_json(json.loads(text)) == value
