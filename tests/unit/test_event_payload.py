"""Stored records keep their payload as text until it is read (journal/records.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.journal.codec import args_digest, encode
from crashproof.journal.fold import step_times
from crashproof.journal.records import Event, EventType
from crashproof.store.port import GENESIS
from crashproof.store.sqlite import SQLiteStore

DIGEST = args_digest((1,), {}, what="test")


def stored(payload_json: str, key: str = "plan") -> Event:
    return Event.stored("r", 3, EventType.STEP_DONE, key, payload_json, 1.5, '"v"')


def test_a_stored_payload_decodes_on_first_read_and_equals_the_built_record() -> None:
    payload = {"kind": "step", "digest": DIGEST, "status": "succeeded", "attempt": 1}
    built = Event(
        run_id="r",
        seq=3,
        type=EventType.STEP_DONE,
        key="plan",
        payload=payload,
        created_at=1.5,
        value_json='"v"',
    )
    record = stored(encode(payload, what="p"))
    assert record == built
    assert record.payload == payload
    assert record.payload is record.payload  # decoded once
    assert repr(record) == repr(built)
    assert record._replace(key="other").key == "other"


def test_mentions_decodes_only_when_the_text_may_hold_the_field() -> None:
    record = stored('{"kind":"step","outbox":true}')
    assert record.mentions("outbox")
    assert not record.mentions("observed")
    plain = stored('{"kind":"step"}')
    assert not plain.mentions("outbox")
    assert plain._payload is None  # not decoded to say no
    quoted = stored('{"kind":"step","note":"outbox"}')  # the word, but as a value
    assert not quoted.mentions("outbox")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_an_unreadable_stored_payload_is_an_integrity_error(text: str) -> None:
    with pytest.raises(cp.IntegrityError, match="event 3 is unreadable"):
        _ = stored(text).payload


def test_a_resume_replays_records_whose_payload_has_another_field_order(tmp_path: Path) -> None:
    """End to end: the run's recorded steps are re-sealed with their payload fields in
    reverse order; the resume replays them (no step body runs again) instead of calling
    it non-determinism."""
    path = tmp_path / "l.db"
    calls: list[int] = []

    def work(i: int) -> int:
        calls.append(i)
        return i * 2

    crash = cp.CrashPoints(match="before_commit[run_succeeded]")
    with cp.Ledger(f"sqlite:///{path}", crash_points=crash) as ledger:

        @ledger.workflow("wf", version="1")
        def wf(ctx: cp.Context, n: int) -> int:
            return sum(ctx.step("s", work, i) for i in range(n))

        with pytest.raises(cp.SimulatedCrash):
            ledger.run(wf, run_id="r", n=3)
    assert calls == [0, 1, 2]

    with cp.Ledger(f"sqlite:///{path}") as ledger:
        store = ledger._store
        if not isinstance(store, SQLiteStore):
            raise TypeError("expected the SQLite store")
        sealer = store.sealer
        if sealer is None:
            raise TypeError("expected a sealing store")
        prev = GENESIS
        for seq, type_, key, payload, value, created_at, _kid, _mac in store.raw_events("r"):
            if type_ == "step_done":
                reordered = dict(reversed(list(json.loads(payload).items())))
                payload = encode(reordered, what="a payload")
                assert not payload.startswith('{"kind"')
            kid, mac = sealer.seal("r", seq, type_, key, payload, value, created_at, prev)
            store._conn.execute(
                "UPDATE events SET payload = ?, key_id = ?, mac = ? WHERE run_id = ? AND seq = ?",
                (payload, kid, mac, "r", seq),
            )
            prev = mac

    with cp.Ledger(f"sqlite:///{path}") as ledger:

        @ledger.workflow("wf", version="1")
        def wf2(ctx: cp.Context, n: int) -> int:
            return sum(ctx.step("s", work, i) for i in range(n))

        assert ledger.resume("r") == 6
    assert calls == [0, 1, 2]


def test_step_times_read_both_payload_forms() -> None:
    older = Event("r", 1, EventType.STEP_DONE, "s", {"started_at": 5.0, "ended_at": 7.5}, 8.0)
    assert step_times(older) == (5.0, 7.5)
    now = Event("r", 1, EventType.STEP_DONE, "s", {"took_us": 2_500_000}, 10.0)
    assert step_times(now) == (7.5, 10.0)


def test_a_live_step_records_how_long_it_took(tmp_path: Path) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:

        @ledger.workflow("wf", version="1")
        def wf(ctx: cp.Context) -> int:
            return int(ctx.step("nap", lambda: time.sleep(0.05) or 1))

        assert ledger.run(wf, run_id="r") == 1
        (step,) = ledger.get_run("r").steps
    assert step.started_at is not None
    assert step.ended_at is not None
    assert 0.05 <= step.ended_at - step.started_at < 5


def test_step_records_built_as_text_are_exactly_what_the_encoder_writes() -> None:
    """The context writes a successful call's payload text directly (no general
    encoding): it must be byte for byte ``codec.encode`` of the payload, for every call
    kind, a retried attempt, and decisions with and without model, usage and cost."""
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 2:
            raise ValueError("once")
        return "ok"

    decisions = [
        cp.Decision("a"),
        cp.Decision({"x": [1, 2.5]}, model="m-1", usage={"input_tokens": 3}, cost=0.25),
        cp.Decision(None, model="modèle \u2603", usage={}, cost=0),
        cp.Decision(1, model="lone \udc80 surrogate", cost=1e-9),
    ]
    with cp.Ledger("memory://") as ledger:

        @ledger.workflow("wf", version="1")
        def wf(ctx: cp.Context) -> int:
            ctx.step("a", lambda i: {"i": i}, 1)
            ctx.step("b", flaky, options=cp.StepOptions(retry=cp.RetryPolicy(backoff=0)))
            for i, decision in enumerate(decisions):
                ctx.decide("d", lambda d=decision: d)
                ctx.decide("plain", lambda i=i: f"answer {i}", i)
            ctx.now(), ctx.random(), ctx.uuid()
            return 0

        assert ledger.run(wf, run_id="r") == 0
        events = ledger._store.load_events("r")
    done = [e for e in events if e.type is EventType.STEP_DONE]
    built = [e for e in done if e.payload_json is not None]
    assert len(done) == 13
    assert len(built) >= 12  # all but (at most) the drive's first record, with its session
    for event in done:
        assert event.payload_text == encode(event.payload, what="a payload"), event.key
    attempts = {e.key: e.payload["attempt"] for e in done}
    assert attempts["b"] == 2
    models = [e.payload.get("model") for e in done if e.key and e.key.startswith("d")]
    assert models == [None, "m-1", "modèle \u2603", "lone \udc80 surrogate"]
