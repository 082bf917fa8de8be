"""A growing transcript costs its new bytes only: counted, not timed. The unit of digest
work is a byte canonicalised for format 2 (``journal.transcript.canonicalised_bytes``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.codec import canonical_bytes, canonical_digest
from crashproof.journal.transcript import V2, canonicalised_bytes, v2_of_parts
from crashproof.runtime.steps.arguments import proven_elements
from crashproof.store.memory import MemoryStore

TURNS = 40
TEXT = "the quick brown fox \u2014 jumps " * 8  # non-ASCII too: the rfc8785 path


def size(value: Any) -> int:
    return len(canonical_bytes(value, what="test"))


def model(messages: list[Any], model: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"{len(messages)} {TEXT}", "parts": [{"n": 1}]}


def agent_of(ledger: cp.Ledger, kind: str, work: list[int]) -> cp.Workflow[int]:
    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        system = {"role": "system", "content": "be brief", "flags": [True, 1, None]}
        messages: list[Any] = cp.Transcript([system]) if kind == "transcript" else [system]
        for turn in range(TURNS):
            before = canonicalised_bytes()
            messages.append({"role": "user", "content": f"{turn} {TEXT}"})
            reply = ctx.decide("turn", model, messages=messages, model="m-1")
            if kind == "copy":  # a new list each turn, of the same message objects
                messages = [*messages, reply]
            else:
                messages.append(reply)
            work.append(canonicalised_bytes() - before)
        return len(messages)

    return agent


@pytest.mark.parametrize("kind", ["list", "copy", "transcript"])
def test_each_turn_canonicalises_its_new_messages_only_live_and_on_resume(kind: str) -> None:
    store = MemoryStore()
    live: list[int] = []
    crash = cp.CrashPoints(match=f"before_commit[step_done:turn#{TURNS}]")
    ledger = cp.Ledger("memory://", store=store, crash_points=crash)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(agent_of(ledger, kind, live), run_id="r")
    ledger.close()

    user = [size({"role": "user", "content": f"{t} {TEXT}"}) for t in range(TURNS)]
    replies = [size(model([None] * (2 * t + 2), "m-1")) for t in range(TURNS)]
    system = size({"role": "system", "content": "be brief", "flags": [True, 1, None]})
    part = size("m-1")  # the other keyword argument: a short string, digested once a drive
    # Turn t canonicalises the new user message and the reply appended after turn t-1.
    expected = [system + user[0] + part] + [user[t] + replies[t - 1] for t in range(1, TURNS)]
    if kind == "transcript":  # a Transcript canonicalises a message when it is appended
        expected = [user[0] + replies[0] + part] + [user[t] + replies[t] for t in range(1, TURNS)]
    assert live == expected[:-1]  # independent of the history's length (the last: crashed)


@pytest.mark.parametrize("kind", ["list", "transcript"])
def test_a_resume_canonicalises_every_message_once(kind: str) -> None:
    store = MemoryStore()
    crash = cp.CrashPoints(match=f"before_commit[step_done:turn#{TURNS}]")
    ledger = cp.Ledger("memory://", store=store, crash_points=crash)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(agent_of(ledger, kind, []), run_id="r")
    ledger.close()
    work: list[int] = []
    with cp.Ledger("memory://", store=store) as again:
        agent_of(again, kind, work)
        before = canonicalised_bytes()
        assert again.resume("r") == 2 * TURNS + 1
        total = canonicalised_bytes() - before
    user = sum(size({"role": "user", "content": f"{t} {TEXT}"}) for t in range(TURNS))
    replies = sum(size(model([None] * (2 * t + 2), "m-1")) for t in range(TURNS))
    system = size({"role": "system", "content": "be brief", "flags": [True, 1, None]})
    # Every message once (the last reply, appended after the last call, is never
    # digested), plus the small keyword argument once.
    last = size(model([None] * (2 * TURNS), "m-1"))
    if kind == "transcript":  # appended after the last call, canonicalised by append
        last = 0
    assert total == system + user + replies - last + size("m-1")


def test_a_resume_proves_a_plain_list_prefix_a_bounded_number_of_times() -> None:
    """Replay trusts the journal for a list's unchanged prefix (steps/arguments.py): the
    full proof runs for the last recorded call and the live one, not for every turn, so
    a resume compares O(T) elements, not O(T²) (trust-free: ~TURNS² = 1,600 and more)."""
    store = MemoryStore()
    crash = cp.CrashPoints(match=f"before_commit[step_done:turn#{TURNS}]")
    ledger = cp.Ledger("memory://", store=store, crash_points=crash)
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(agent_of(ledger, "list", []), run_id="r")
    ledger.close()
    with cp.Ledger("memory://", store=store) as again:
        agent_of(again, "list", [])
        before = proven_elements()
        assert again.resume("r") == 2 * TURNS + 1
        proven = proven_elements() - before
    assert proven <= 2 * (2 * TURNS + 1)  # the last replayed call's prefix and the live one's
    assert proven > 0  # they were proven


def test_parts_spelled_out_are_the_canonical_digest() -> None:
    """v2_of_parts spells the RFC 8785 text out for identifier names: the same digest
    as canonical_digest, whatever the names' order; other names take canonical_digest."""
    parts = ["l:" + "ab" * 32, "j:" + "cd" * 32]
    for named in (
        {},
        {"model": "j:" + "01" * 32, "messages": "l:" + "02" * 32, "Z_1": "j:00"},
        {"b": "j:1", "a": "l:2"},
        {"with space": "j:1", "é": "j:2"},  # not spelled out
    ):
        expected = V2 + canonical_digest({"args": parts, "kwargs": named}, what="t")
        assert v2_of_parts(parts, named) == expected


def test_replay_check_reports_an_edit_the_trusting_replay_lets_pass(tmp_path: Path) -> None:
    """An earlier message edited in place before a replayed call and restored after it:
    a drive's replay, which trusts the journal for the prefix (steps/arguments.py), returns
    the recorded answers; cp.replay_check never trusts and reports the call."""
    db = tmp_path / "l.db"

    def flow(edit: bool) -> cp.Workflow[int]:
        @cp.workflow("agent", version="1")
        def agent(ctx: cp.Context) -> int:
            messages: list[Any] = [{"role": "system", "content": "be brief"}]
            for turn in range(6):
                messages.append({"role": "user", "content": f"{turn}"})
                if edit and turn == 2:
                    messages[0]["content"] = "be long"
                messages.append(ctx.decide("turn", model, messages=messages, model="m-1"))
                messages[0]["content"] = "be brief"
            return len(messages)

        return agent

    crash = cp.CrashPoints(match="before_commit[step_done:turn#6]")
    with (
        cp.Ledger(f"sqlite:///{db}", crash_points=crash) as ledger,
        pytest.raises(cp.SimulatedCrash),
    ):
        ledger.run(flow(False), run_id="r")
    [verdict] = cp.replay_check([flow(True)], db)
    assert verdict.status == "non_deterministic"
    assert verdict.key == "turn#3"
    with cp.Ledger(f"sqlite:///{db}") as again:
        assert again.run(flow(True), run_id="r") == 13  # trusted: not reported
