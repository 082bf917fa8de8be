"""A growing transcript costs its new bytes only: counted, not timed. The unit of digest
work is a byte canonicalised for format 2 (``journal.transcript.canonicalised_bytes``)."""

from __future__ import annotations

from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.codec import canonical_bytes
from crashproof.journal.transcript import canonicalised_bytes
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
    part = size("m-1")  # the other keyword argument, digested whole each call
    # Turn t canonicalises the new user message and the reply appended after turn t-1.
    expected = [system + user[0] + part] + [
        user[t] + replies[t - 1] + part for t in range(1, TURNS)
    ]
    if kind == "transcript":  # a Transcript canonicalises a message when it is appended
        expected = [user[t] + replies[t] + part for t in range(TURNS)]
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
    # digested), plus the small keyword argument of each call.
    last = size(model([None] * (2 * TURNS), "m-1"))
    if kind == "transcript":  # appended after the last call, canonicalised by append
        last = 0
    assert total == system + user + replies - last + TURNS * size("m-1")
