"""The work-queue side of every store (crashproof.store.queue): claim the next runnable
run, skip what is held, take over what expired, never hand one run to two claimers."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from contract.test_store_contract import Backend, backend, event, row, start
from crashproof import LeaseHeld, StaleLeaseError
from crashproof.journal.records import RunStatus
from crashproof.store.queue import QueueStore, queue_store, runnable_key

__all__ = ["backend"]  # the fixture, imported from the store contract

WF = [runnable_key("wf", "1")]


def queue(backend: Backend) -> QueueStore:
    return queue_store(backend.store)


def test_claim_next_takes_the_oldest_unowned_run_with_a_new_token(backend: Backend) -> None:
    start(backend.store, "young", created_at=2000.0)
    start(backend.store, "old", created_at=1000.0)
    before = time.time()
    claimed = queue(backend).claim_next("w1", 30.0, WF)
    assert claimed is not None
    assert (claimed.run_id, claimed.previous_owner) == ("old", None)
    assert (claimed.lease.owner, claimed.lease.token, claimed.lease.ttl_seconds) == ("w1", 1, 30.0)
    assert before + 29.0 < claimed.lease.expires_at < time.time() + 31.0
    # The claim is a real lease: another claimer meets it, the holder writes under it.
    with pytest.raises(LeaseHeld, match="owned by worker w1"):
        backend.store.claim("old", "w2", 30.0)
    backend.store.append([event("old", 1)], fencing_token=claimed.lease.token)
    second = queue(backend).claim_next("w2", 30.0, WF)
    assert second is not None
    assert second.run_id == "young"
    assert queue(backend).claim_next("w3", 30.0, WF) is None


def test_claim_next_skips_held_ended_excluded_and_foreign_runs(backend: Backend) -> None:
    store = backend.store
    start(store, "held", created_at=1.0)
    store.claim("held", "w0", 30.0)
    start(store, "ended", created_at=2.0)
    store.append([event("ended", 1)], (RunStatus.SUCCEEDED, None))
    start(store, "frozen", created_at=3.0)
    store.append([event("frozen", 1)], (RunStatus.NEEDS_REVIEW, "drift"))
    other = replace(row("other-version", created_at=4.0), version="2")
    assert store.create_run(other, event("other-version", 0)) is None
    start(store, "excluded", created_at=5.0)
    start(store, "free", created_at=6.0)
    claimed = queue(backend).claim_next("w1", 30.0, WF, exclude=["excluded"])
    assert claimed is not None
    assert claimed.run_id == "free"
    assert queue(backend).claim_next("w1", 30.0, WF, exclude=["excluded"]) is None
    # A worker that registers version 2 too may take that run.
    both = [*WF, runnable_key("wf", "2")]
    claimed = queue(backend).claim_next("w1", 30.0, both, exclude=["excluded"])
    assert claimed is not None
    assert claimed.run_id == "other-version"


def test_claim_next_takes_over_an_expired_lease_and_fences_the_old_owner(
    backend: Backend,
) -> None:
    start(backend.store, "r")
    old = backend.store.claim("r", "dead", 0.2)
    assert queue(backend).claim_next("w1", 30.0, WF) is None  # still held
    time.sleep(0.3)
    claimed = queue(backend).claim_next("w1", 30.0, WF)
    assert claimed is not None
    assert (claimed.run_id, claimed.previous_owner, claimed.lease.token) == ("r", "dead", 2)
    with pytest.raises(StaleLeaseError):
        backend.store.append([event("r", 1)], fencing_token=old.token)
    with pytest.raises(StaleLeaseError):
        backend.store.renew("r", old)
    assert len(backend.store.load_events("r")) == 1


def test_a_released_run_is_claimable_again_with_a_higher_token(backend: Backend) -> None:
    start(backend.store, "r")
    first = queue(backend).claim_next("w1", 30.0, WF)
    assert first is not None
    backend.store.release("r", first.lease)
    again = queue(backend).claim_next("w2", 30.0, WF)
    assert again is not None
    assert (again.run_id, again.previous_owner, again.lease.token) == ("r", None, 2)


def test_concurrent_claimers_never_get_the_same_run(backend: Backend) -> None:
    runs = [f"r{i}" for i in range(12)]
    for i, run_id in enumerate(runs):
        start(backend.store, run_id, created_at=float(i))
    got: list[str] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        while (claimed := queue(backend).claim_next(name, 30.0, WF)) is not None:
            with lock:
                got.append(claimed.run_id)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(got) == sorted(runs)  # each exactly once


def test_leases_report_owner_expiry_and_token_of_every_run(backend: Backend) -> None:
    start(backend.store, "a")
    start(backend.store, "b")
    lease = backend.store.claim("a", "w1", 30.0)
    leases = queue(backend).leases()
    assert set(leases) == {"a", "b"}
    assert (leases["a"].owner, leases["a"].token) == ("w1", 1)
    assert leases["a"].expires_at == pytest.approx(lease.expires_at, abs=0.01)
    assert (leases["b"].owner, leases["b"].expires_at, leases["b"].token) == (None, None, 0)
    backend.store.release("a", lease)
    assert (queue(backend).leases()["a"].owner, queue(backend).leases()["a"].token) == (None, 1)
