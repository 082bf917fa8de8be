"""The index of unresolved act intents across runs (crashproof.store.intents), on every
store: held while an act's intent has no final record, released by it or by the run's
end, and a new run's intent with the same digest on the same instance refused."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from contract.test_store_contract import Backend, backend, start
from crashproof import IntentHeld, StaleLeaseError
from crashproof.journal.records import Event, EventType, RunStatus
from crashproof.store.port import Store

__all__ = ["backend"]  # the fixture, imported from the store contract

DIGEST = "a" * 64


def intent(
    run_id: str,
    seq: int,
    key: str = "create",
    *,
    digest: str = DIGEST,
    instance: str | None = None,
    attempt: int = 1,
    overrides: list[str] | None = None,
) -> Event:
    payload: dict[str, Any] = {
        "kind": "act",
        "digest": digest,
        "operation_id": f"{run_id}/{key}",
        "intent_digest": digest,
        "tool": "t",
        "tool_version": "1",
        "attempt": attempt,
        "started_at": 1000.0 + seq,
    }
    if instance is not None:
        payload["observed"] = {"before": {"instance": instance, "fingerprint": "f"}}
    if overrides is not None:
        payload["overrides"] = overrides
    return Event(run_id, seq, EventType.ACT_INTENT, key, payload, 1000.0 + seq)


def done(run_id: str, seq: int, key: str = "create", *, kind: str = "act") -> Event:
    payload = {"kind": kind, "digest": DIGEST, "status": "succeeded", "attempt": 1}
    return Event(run_id, seq, EventType.STEP_DONE, key, payload, 1000.0 + seq, "null")


def record(run_id: str, seq: int, type_: EventType, key: str | None = None) -> Event:
    return Event(run_id, seq, type_, key, {"status": "x"}, 1000.0 + seq)


def holds(store: Store, run_id: str | None = None) -> list[tuple[str, str, str, str]]:
    found = store.unresolved_intents(run_id)
    return [(h.run_id, h.key, h.intent_digest, h.instance) for h in found]


def test_an_intent_is_held_until_its_act_ends(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    store.append([intent("A", 1, instance="ws:/a")])
    assert holds(store) == [("A", "create", DIGEST, "ws:/a")]
    [hold] = store.unresolved_intents("A")
    assert hold.since == 1001.0
    # An unknown outcome, a freeze, a later attempt: still held, still since the first.
    store.append([record("A", 2, EventType.ACT_UNKNOWN, "create")])
    store.append([record("A", 3, EventType.RUN_FROZEN, "create")])
    store.append([intent("A", 4, attempt=2)])
    assert [(h.key, h.since, h.instance) for h in store.unresolved_intents()] == [
        ("create", 1001.0, "ws:/a")
    ]
    store.append([done("A", 5, "other", kind="step")])  # another step's end: no change
    assert holds(store, "A") == [("A", "create", DIGEST, "ws:/a")]
    store.append([done("A", 6)])
    assert holds(store) == []


@pytest.mark.parametrize("ending", [EventType.RUN_SUCCEEDED, EventType.RUN_FAILED])
def test_the_runs_end_releases_all_its_holds(backend: Backend, ending: EventType) -> None:
    store = backend.store
    start(store, "A")
    start(store, "B")
    store.append([intent("A", 1, "x"), intent("A", 2, "y", digest="b" * 64)])
    store.append([intent("B", 1, "z", digest="c" * 64)])
    store.append([record("A", 3, ending)], (RunStatus.FAILED, None))
    assert holds(store) == [("B", "z", "c" * 64, "")]


def stop(run_id: str, seq: int, key: str = "create", *, none_done: bool = True) -> Event:
    """The stop of a run whose act ``key`` was out (runtime/steps/outage.py)."""
    out = {"kind": "act", "attempt": 2, "operation_id": f"{run_id}/{key}"}
    if none_done:
        out["none_done"] = True
    evidence = {"reason": f"unavailable:{key}: out", "next_step": key, "unavailable": out}
    payload = {"status": "stopped", "reason": f"unavailable:{key}: out", "evidence": evidence}
    return Event(run_id, seq, EventType.RUN_STOPPED, key, payload, 1000.0 + seq)


def test_a_stop_of_an_act_none_of_whose_attempts_was_done_releases_it(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    start(store, "B")
    store.append([intent("A", 1, instance="ws:/a"), intent("A", 2, "other", digest="b" * 64)])
    store.append([stop("A", 3, none_done=False)])  # the last attempt only: still held
    assert [h.key for h in store.unresolved_intents("A")] == ["create", "other"]
    store.append([stop("A", 4)], status=(RunStatus.STOPPED, "unavailable:create: out"))
    assert [h.key for h in store.unresolved_intents("A")] == ["other"]  # that act only
    store.append([intent("B", 1, instance="ws:/a")])  # another run may act on it now
    with pytest.raises(IntentHeld):  # and the resume's new hold waits for B's
        store.append([intent("A", 5, instance="ws:/a", attempt=3)])
    store.append([done("B", 2)])
    store.append([intent("A", 5, instance="ws:/a", attempt=3)])
    assert [(h.key, h.since) for h in store.unresolved_intents("A")] == [
        ("other", 1002.0),
        ("create", 1005.0),  # held anew
    ]


def test_another_runs_same_intent_is_refused_and_nothing_of_it_kept(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    start(store, "B")
    store.append([intent("A", 1, instance="ws:/a")])
    with pytest.raises(IntentHeld, match="run 'A' holds the same intent unresolved") as caught:
        store.append([intent("B", 1, instance="ws:/a")], (RunStatus.RUNNING, "changed"))
    assert caught.value.holders == [{"run_id": "A", "key": "create", "since": 1001.0}]
    assert [e.seq for e in store.load_events("B")] == [0]  # nothing of the append kept
    row = store.get_run("B")
    assert row is not None
    assert row.reason is None
    assert holds(store) == [("A", "create", DIGEST, "ws:/a")]
    # The journal goes on at the same seq: the refusal left the store consistent.
    store.append([done("B", 1, "other", kind="step")])
    # Once A's act ends, B's intent is accepted.
    store.append([done("A", 2)])
    store.append([intent("B", 2, instance="ws:/a")])
    assert holds(store) == [("B", "create", DIGEST, "ws:/a")]


def test_a_move_keeps_the_holds_its_act_may_still_be_unresolved_elsewhere(
    backend: Backend,
) -> None:
    store = backend.store
    start(store, "A")
    store.append([intent("A", 1)])
    store.append([record("A", 2, EventType.RUN_MOVED)], (RunStatus.MOVED, None))
    assert holds(store) == [("A", "create", DIGEST, "")]


def test_the_same_run_is_never_refused_by_itself(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    store.append([intent("A", 1, "first")])
    store.append([intent("A", 2, "second")])  # the same intent at two steps of one run
    assert [h.key for h in store.unresolved_intents("A")] == ["first", "second"]


def test_other_digests_and_other_instances_are_other_intents(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    start(store, "B")
    start(store, "C")
    store.append([intent("A", 1, instance="ws:/a")])
    store.append([intent("B", 1, instance="ws:/b")])  # the same params on another workspace
    store.append([intent("C", 1, digest="e" * 64, instance="ws:/a")])
    assert len(store.unresolved_intents()) == 3


def test_a_retry_of_an_own_held_act_is_not_refused_by_another_holder(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    start(store, "B")
    store.append([intent("A", 1)])
    store.append([intent("B", 1, overrides=["A"])])  # overridden: both hold it now
    store.append([intent("B", 2, attempt=2)])  # B's own act again: no check, no override
    assert sorted(holds(store)) == [("A", "create", DIGEST, ""), ("B", "create", DIGEST, "")]


def test_an_override_names_the_runs_it_passes(backend: Backend) -> None:
    store = backend.store
    for run in ("A", "B", "C"):
        start(store, run)
    store.append([intent("A", 1)])
    store.append([intent("B", 1, overrides=["A"])])
    with pytest.raises(IntentHeld, match="run 'B' holds") as caught:
        store.append([intent("C", 1, overrides=["A"])])  # B holds it too, not overridden
    assert [h["run_id"] for h in caught.value.holders] == ["B"]


def test_a_refused_intent_in_a_batch_keeps_nothing_of_the_batch(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    start(store, "B")
    store.append([intent("A", 1)])
    with pytest.raises(IntentHeld):
        store.append([done("B", 1, "s", kind="step"), intent("B", 2, "x", digest="f" * 64),
                      intent("B", 3)])  # fmt: skip
    assert [e.seq for e in store.load_events("B")] == [0]
    assert holds(store, "B") == []


def test_a_stale_writer_changes_no_hold(backend: Backend) -> None:
    store = backend.store
    start(store, "A")
    lease = store.claim("A", "w1", 30.0)
    store.claim("A", "w2", 30.0, take_over=True)
    with pytest.raises(StaleLeaseError):
        store.append([intent("A", 1)], fencing_token=lease.token)
    assert holds(store) == []


def test_two_runs_racing_for_one_intent_one_wins(backend: Backend) -> None:
    store = backend.store
    runs = [f"R{i}" for i in range(6)]
    for run in runs:
        start(store, run)
    barrier = threading.Barrier(len(runs))
    outcomes: dict[str, str] = {}

    def go(run: str) -> None:
        barrier.wait()
        try:
            store.append([intent(run, 1)])
            outcomes[run] = "held"
        except IntentHeld:
            outcomes[run] = "refused"

    threads = [threading.Thread(target=go, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes.values()) == ["held"] + ["refused"] * 5
    [winner] = [run for run, outcome in outcomes.items() if outcome == "held"]
    assert holds(store) == [(winner, "create", DIGEST, "")]
