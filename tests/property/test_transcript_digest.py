"""Arguments digest format 2: the incremental digest (a Context's per-slot chains, a
cp.Transcript) equals the specified digest computed from scratch for any sequence of
lists and edits, and an edit of an earlier message is a mismatch on replay."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crashproof as cp
from crashproof.journal.transcript import Transcript, digest_v2
from crashproof.runtime.steps.arguments import ArgumentDigests
from crashproof.store.memory import MemoryStore

SAFE = 2**53 - 1
leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE, max_value=SAFE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
messages = st.dictionaries(st.sampled_from(["role", "content", "n", "parts"]), values, max_size=4)


def _in_place(target: Any, new: Any) -> None:
    """Change ``target`` (a message) in place, at its deepest container if any."""
    if isinstance(target, dict):
        for v in target.values():
            if isinstance(v, dict | list) and v:
                return _in_place(v, new)
        target["content"] = new
    elif isinstance(target, list):
        target[0] = new


# One edit of the list the next call passes (the same list object, changed).
edits = st.one_of(
    st.tuples(st.just("append"), messages),
    st.tuples(st.just("replace"), st.integers(0, 20), messages),
    st.tuples(st.just("in_place"), st.integers(0, 20), values),
    st.tuples(st.just("flip"), st.integers(0, 20)),  # True <-> 1, False <-> 0: == says equal
    st.tuples(st.just("delete"), st.integers(0, 20)),
    st.tuples(st.just("insert"), st.integers(0, 20), messages),
    st.tuples(st.just("same")),
)


def _apply(history: list[Any], edit: tuple[Any, ...]) -> None:
    op = edit[0]
    if op == "append":
        history.append(edit[1])
    elif op == "same" or not history:
        return
    elif op == "replace":
        history[edit[1] % len(history)] = edit[2]
    elif op == "in_place":
        _in_place(history[edit[1] % len(history)], edit[2])
    elif op == "flip":
        m = history[edit[1] % len(history)]
        if isinstance(m, dict):
            for k, v in m.items():
                if type(v) is bool:
                    m[k] = int(v)
                elif type(v) is int and v in (0, 1):
                    m[k] = bool(v)
    elif op == "delete":
        del history[edit[1] % len(history)]
    elif op == "insert":
        history.insert(edit[1] % (len(history) + 1), edit[2])


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, max_size=4), st.lists(edits, min_size=1, max_size=12), st.booleans())
def test_incremental_digest_equals_the_digest_from_scratch(
    start: list[Any], script: list[tuple[Any, ...]], as_tuple: bool
) -> None:
    digests = ArgumentDigests()
    history = copy.deepcopy(start)
    for edit in script:
        _apply(history, edit)
        args = (tuple(history),) if as_tuple else (history,)
        got = digests.of("turn", args, {"model": "m"}, "arguments of decide", "turn", None)
        assert got == digest_v2(args, {"model": "m"})
        assert got == digest_v2((copy.deepcopy(history),), {"model": "m"})
        got_kw = digests.of("turn", ("m",), {"messages": history}, "arguments", "turn", None)
        assert got_kw == digest_v2(("m",), {"messages": history})
        assert digest_v2((Transcript(history),), {"model": "m"}) == got  # the same digest


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6), st.lists(messages, max_size=3))
def test_a_transcript_digest_is_its_list_digest_and_it_refuses_changes(
    start: list[Any], more: list[Any]
) -> None:
    transcript = Transcript(start)
    transcript.extend(more)
    transcript += more
    plain = start + more + more
    assert transcript == plain
    digests = ArgumentDigests()
    assert digests.of("t", (transcript,), {}, "a", "t", None) == digest_v2((plain,), {})
    with pytest.raises(TypeError, match="append-only"):
        transcript[0] = {}
    with pytest.raises(TypeError, match="cannot be changed"):
        transcript[0]["role"] = "x"
    assert transcript == plain


TURNS = 5


def _agent(
    ledger: cp.Ledger, history: list[Any], change: dict[str, Any], asked: list[int]
) -> cp.Workflow[int]:
    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        messages = copy.deepcopy(history)
        for turn in range(TURNS):
            if change and turn == change["turn"]:
                _apply(messages, change["edit"])  # the new code changes an earlier message
            messages.append(ctx.decide("turn", lambda m: _model(m, asked), messages))
        return len(messages)

    return agent


def _model(messages: list[Any], asked: list[int]) -> dict[str, Any]:
    asked.append(len(messages))
    return {"role": "assistant", "n": len(messages)}


earlier_edits = st.one_of(
    st.tuples(st.just("replace"), st.integers(0, 20), messages),
    st.tuples(st.just("in_place"), st.integers(0, 20), values),
    st.tuples(st.just("flip"), st.integers(0, 20)),
    st.tuples(st.just("delete"), st.integers(0, 20)),
    st.tuples(st.just("insert"), st.integers(0, 20), messages),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=3), st.integers(1, TURNS - 2), earlier_edits)
def test_an_edit_of_an_earlier_message_is_a_mismatch_on_replay(
    history: list[Any], turn: int, edit: tuple[Any, ...]
) -> None:
    store = MemoryStore()  # outlives each ledger, as a file would
    asked: list[int] = []
    crash = cp.CrashPoints(match=f"before_commit[step_done:turn#{TURNS}]")
    first = cp.Ledger("memory://", store=store, crash_points=crash)
    with pytest.raises(cp.SimulatedCrash):
        first.run(_agent(first, history, {}, asked), run_id="r")
    first.close()
    # What the new code passes at ``turn`` (recorded: the crash was at the last turn):
    # the messages so far, with the edit applied.
    messages = copy.deepcopy(history)
    for _ in range(turn):
        messages.append({"role": "assistant", "n": len(messages)})
    before = copy.deepcopy(messages)
    _apply(messages, edit)
    changed = digest_v2((messages,), {}) != digest_v2((before,), {})
    asked.clear()
    with cp.Ledger("memory://", store=store) as second:
        agent = _agent(second, history, {"turn": turn, "edit": edit}, asked)
        if changed:  # any change of what the recorded call was given: frozen, nothing asked
            with pytest.raises(cp.RunFrozen, match=r"arguments differ|another call"):
                second.resume("r")
            assert asked == []
        else:  # the edit changed nothing (same value written back): replayed as recorded
            second.resume("r")
            assert len(asked) == 1
        del agent
