"""A decision's request is stored as what it adds to the same slot's last stored request
(#40): folding the stored deltas in order gives back exactly each call's request, for
any history an agent may pass (appended, shortened, rebuilt, changed in place), across a
stop and a resume; a request that does not match its digest is refused, never shown."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crashproof as cp
from crashproof.journal.records import Event, EventType
from crashproof.runtime.operations.requests import NOT_STORED, model_requests

_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text(max_size=8)},
    optional={"n": st.one_of(st.integers(-3, 3), st.booleans(), st.none())},
)
# One turn's change to the history: append, drop the tail, rebuild, edit in place.
_change = st.one_of(
    st.tuples(st.just("append"), st.lists(_message, min_size=1, max_size=3)),
    st.tuples(st.just("shrink"), st.integers(0, 3)),
    st.tuples(st.just("rebuild"), st.lists(_message, max_size=3)),
    st.tuples(st.just("edit"), st.text(max_size=4)),
)


def _apply(history: list[Any], change: tuple[str, Any]) -> list[Any]:
    kind, arg = change
    if kind == "append":
        history.extend(copy.deepcopy(arg))
    elif kind == "shrink":
        del history[max(0, len(history) - arg) :]
    elif kind == "rebuild":
        return copy.deepcopy(history[:1]) + copy.deepcopy(arg)
    elif history:
        history[0]["content"] = arg  # in place: the same list object, an old element changed
    return history


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    changes=st.lists(_change, min_size=1, max_size=8),
    stop_at=st.one_of(st.none(), st.integers(0, 7)),
    use_transcript=st.booleans(),
)
def test_folding_the_deltas_gives_back_each_request(
    tmp_path_factory: pytest.TempPathFactory,
    changes: list[tuple[str, Any]],
    stop_at: int | None,
    use_transcript: bool,
) -> None:
    root = tmp_path_factory.mktemp("deltas")
    ledger = cp.Ledger(f"sqlite:///{root / 'runs.db'}", store_requests=True)
    asked: dict[str, Any] = {}  # key -> the request as the call saw it (live only)
    down = {"on": stop_at is not None}

    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        history: list[Any] = [{"role": "system", "content": "be brief"}]
        for turn, change in enumerate(changes):
            history = _apply(history, change)
            passed: Any = history
            if use_transcript and turn % 2:
                passed = cp.Transcript(copy.deepcopy(history))

            def model(messages: list[Any], model: str, turn: int = turn) -> int:
                if down["on"] and turn == stop_at:
                    raise cp.Unavailable("the model is down")
                asked[ctx.last_key or ""] = copy.deepcopy(list(messages))
                return len(messages)

            ctx.decide(
                "turn",
                model,
                messages=passed,
                model="m",
                options=cp.StepOptions(retry=cp.RetryPolicy(attempts=1)),
            )
        ctx.decide("plain", lambda a, b: a, 1, b="two")  # format 1: stored whole
        return len(history)

    try:
        ledger.run(agent, run_id="r")
    except cp.RunStopped:
        down["on"] = False
        ledger.resume("r")
    events = ledger.journal("r")
    keys = [e.key for e in events if e.type is EventType.STEP_DONE and e.key]
    folded = model_requests(events, keys, lambda: ledger.store.load_requests("r"))
    for key, messages in asked.items():
        got = folded[key]
        assert got.refused is None, (key, got.refused)
        assert got.kwargs == {"messages": messages, "model": "m"}
    assert folded["plain"].args == (1,)
    assert folded["plain"].kwargs == {"b": "two"}
    ledger.close()


def test_a_request_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'runs.db'}", store_requests=True)

    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        history = [{"role": "user", "content": "hello"}]
        return int(ctx.decide("turn", lambda messages: len(messages), messages=history))

    ledger.run(agent, run_id="r")
    events = ledger.journal("r")
    done = next(e for e in events if e.key == "turn")
    texts = ledger.store.load_requests("r")
    text = texts[done.seq]  # kept beside the record, which holds only its digest
    assert "request" not in done.payload
    assert "hello" not in (done.payload_json or "")
    assert done.payload["request_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    shown = model_requests(events, ["turn"], lambda: texts)["turn"]
    assert shown.kwargs == {"messages": [{"role": "user", "content": "hello"}]}
    # Altered beside its record: refused by the record's digest, before it is read.
    altered = {done.seq: text.replace("hello", "HELLO")}
    refused = model_requests(events, ["turn"], lambda: altered)["turn"].refused
    assert refused is not None
    assert "does not match the digest its record holds" in refused
    gone = model_requests(events, ["turn"], dict)["turn"].refused
    assert gone is not None
    assert "missing" in gone
    # A journal before schema 9 held its request inline: still shown, still proven.
    older = {k: v for k, v in done.payload.items() if k != "request_sha256"}
    inline = Event("r", done.seq, done.type, done.key, {**older, "request": text}, 0.0)
    assert model_requests([inline], ["turn"])["turn"].kwargs == shown.kwargs
    request = text.replace("hello", "HELLO")
    altered_inline = Event("r", done.seq, done.type, done.key, {**older, "request": request}, 0.0)
    refused = model_requests([altered_inline], ["turn"])["turn"].refused
    assert refused is not None
    assert "does not match the recorded arguments digest" in refused
    bare = Event("r", done.seq, done.type, done.key, older, 0.0)
    assert model_requests([bare], ["turn"])["turn"].refused == NOT_STORED
    ledger.close()


def test_store_requests_false_stores_none(tmp_path: Path) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'runs.db'}", store_requests=False)

    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        history = [{"role": "user", "content": "a secret prompt"}]
        for _ in range(3):
            history.append({"role": "user", "content": "more"})
            ctx.decide("turn", lambda messages: len(messages), messages=history)
        return 0

    ledger.run(agent, run_id="r")
    events = ledger.journal("r")
    assert not any("secret prompt" in (e.payload_json or str(e.payload)) for e in events)
    folded = model_requests(
        events, ["turn", "turn#2", "turn#3"], lambda: ledger.store.load_requests("r")
    )
    assert {r.refused for r in folded.values()} == {NOT_STORED}
    assert ledger.store.load_requests("r") == {}
    ledger.close()


def test_requests_are_stored_by_default_beside_their_records(tmp_path: Path) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'runs.db'}")

    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> int:
        history = [{"role": "user", "content": "a prompt"}]
        return int(ctx.decide("turn", lambda messages: len(messages), messages=history))

    ledger.run(agent, run_id="r")
    events = ledger.journal("r")
    assert not any("a prompt" in (e.payload_json or str(e.payload)) for e in events)
    folded = model_requests(events, ["turn"], lambda: ledger.store.load_requests("r"))
    assert folded["turn"].kwargs == {"messages": [{"role": "user", "content": "a prompt"}]}
    ledger.close()
