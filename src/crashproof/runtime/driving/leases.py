"""Leases: one driver per run. Claiming (with the takeover of holders that are provably
gone), releasing, and the heartbeat that renews a lease while its run is driven."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from crashproof.errors import CrashproofError, LeaseHeld, StaleLeaseError
from crashproof.runtime.driving.batching import off_loop
from crashproof.store.port import Lease, Store

__all__ = [
    "HOST",
    "Grant",
    "Heartbeat",
    "TaskHeartbeat",
    "abandoned",
    "adopt",
    "claim",
    "operator_lease",
    "release",
    "stop_driving",
]

log = logging.getLogger("crashproof.runtime.ledger")

HOST = socket.gethostname()
# (worker id, run id) of every lease a Ledger of this process is driving right now. A
# lease of this process that is not listed here was left by a run that crashed
# (SimulatedCrash): nobody drives it any more, so a new Ledger may take it over at once.
DRIVING: set[tuple[str, str]] = set()
DRIVING_LOCK = threading.Lock()
_WAIT_POLL = 0.1  # seconds between claims while waiting for a held lease


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease this process claimed, and why it could take a live lease of another
    holder (``takeover``: the holder is gone; None: it was not live, or an operator
    asked for the take-over)."""

    lease: Lease
    takeover: str | None = None

    def receipt(self, run_id: str) -> dict[str, Any]:
        """What the drive journals about its lease (003: ``resume_lease_receipt``): lease
        id, owner, the previous owner and token, the new token, its expiry, and the
        decision that let this owner in."""
        lease = self.lease
        previous = lease.previous_owner
        if previous is None:
            decision = "new" if lease.token == 1 else "released"
        elif previous == lease.owner:
            decision = "same owner"
        elif not lease.previous_live:
            decision = "expired"
        else:
            decision = self.takeover or "take-over requested"
        return {
            "lease_id": f"{run_id}@{lease.token}",
            "owner": lease.owner,
            "previous_owner": previous,
            "previous_token": lease.token - 1,
            "token": lease.token,
            "expires_at": lease.expires_at,
            "decision": decision,
        }


def _gone(owner: str) -> str:
    pid = owner.rsplit(":", 2)[1]
    return "abandoned in this process" if pid == str(os.getpid()) else f"dead pid {pid}"


def abandoned(owner: str, run_id: str) -> bool:
    """Whether the lease holder is provably gone: a worker of this process that is not
    driving the run, or a process of this host that no longer exists. Anything else (another
    host, a live process, an unrecognised id) is presumed alive until its lease expires."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != HOST or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        with DRIVING_LOCK:
            return (owner, run_id) not in DRIVING
    return not _process_alive(pid)


def _process_alive(pid: int) -> bool:
    if sys.platform == "win32" or pid <= 0:
        return True  # no cheap, safe probe: wait for the lease to expire
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # e.g. another user's process
    try:  # a killed process not yet reaped by its parent is a zombie: gone
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


class Ending(Protocol):
    """A drive as its heartbeat sees it: ``ended`` once the run's outcome is committed,
    which released the lease too (a terminal status does, ``Store.append``): no release
    is due then."""

    ended: bool


class Heartbeat:
    """Renews a lease every ttl/3 from a daemon thread until stopped. A renewal refused
    as stale marks the lease lost: the run stops at its next commit."""

    def __init__(self, store: Store, run_id: str, lease: Lease, lost: Callable[[], None]) -> None:
        self._store = store
        self._run_id = run_id
        self.lease = lease
        self._lost = lost
        self.drive: Ending | None = None  # set once the drive has opened
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"crashproof-lease:{run_id}", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        interval = self.lease.ttl_seconds / 3
        while not self._stopped.wait(interval):
            if not self._renew():
                return

    def _renew(self) -> bool:
        """One renewal; False once the lease is lost (the run stops at its next commit),
        or went with the run's outcome (nothing to renew, nothing lost)."""
        if self.drive is not None and self.drive.ended:
            return False
        try:
            self.lease = self._store.renew(self._run_id, self.lease)
        except StaleLeaseError:
            return self._refused()
        except Exception as exc:  # e.g. the database is briefly unreachable: try again
            log.warning("lease renewal failed: %s", exc, extra={"run_id": self._run_id})
        return True

    def _refused(self) -> bool:
        """A renewal was refused as stale: the lease is lost, unless the drive let it go
        meanwhile (stopped and released it, or committed the run's outcome, which
        releases it: the renewal raced the drive's end). Returns False (renew no more)."""
        if self._stopped.is_set() or self._ended_in_store():
            log.debug("lease went with the run's end", extra={"run_id": self._run_id})
            return False
        log.warning("lease lost", extra={"run_id": self._run_id})
        self._lost()
        return False

    def _ended_in_store(self) -> bool:
        """Whether the run's outcome is committed (its status terminal), which released
        the lease. Harmless when another owner committed it: this drive's next commit is
        refused by its fencing token all the same."""
        try:
            row = self._store.get_run(self._run_id)
        except Exception:
            return False  # unknown: count the lease lost
        return row is not None and row.status.terminal

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=max(1.0, self.lease.ttl_seconds))

    def release(self) -> None:
        """The drive ended: free the lease for anyone (after ``stop``)."""
        if self.drive is None or not self.drive.ended:
            release(self._store, self._run_id, self.lease)


class TaskHeartbeat(Heartbeat):
    """``Heartbeat`` for an async drive, with no thread of its own. The async drives of a
    loop are renewed together by one thread (``_Renewals``): a thousand runs on a loop
    renew in one statement every ttl/3 instead of a thousand threads each waking alone,
    and a busy loop (a CPU-bound step, a thousand runs' turns) never delays a renewal:
    the lease says the process is alive, not that its loop is idle, as a thread's
    heartbeat beside a long synchronous step does. A process that stops (killed,
    suspended, partitioned from the database) stops renewing too, so its lease expires
    and whoever claims the run bumps the fencing token: this process's next commit is
    refused (DESIGN §7). The release is a commit in a commit thread, as the drive's own
    are: the loop never waits on it."""

    def __init__(  # (the thread of the base class is never started)
        self, store: Store, run_id: str, lease: Lease, lost: Callable[[], None]
    ) -> None:
        self._store = store
        self._run_id = run_id
        self.lease = lease
        self._lost = lost
        self.drive = None
        self._stopped = threading.Event()
        self._loop = asyncio.get_running_loop()
        self.due = time.monotonic() + lease.ttl_seconds / 3  # the next renewal
        self._renewals = _renewals(self._loop, lease.ttl_seconds)
        self._renewals.add(self)
        self.released: asyncio.Future[None] | None = None  # the release, awaited by the drive

    def stop(self) -> None:
        self._stopped.set()
        self._renewals.discard(self)

    def release(self) -> None:
        if self.drive is None or not self.drive.ended:
            self.released = asyncio.ensure_future(off_loop(super().release), loop=self._loop)


class _Renewals:
    """The heartbeats of a loop's async drives under leases of one ttl, renewed by one
    daemon thread: it sleeps until the earliest is due (a heartbeat added later, of the
    same ttl, is never due earlier), renews every one due by then or within the next
    ttl/6 (a little early, so that runs started a moment apart share a statement), and
    ends when none is left; the next heartbeat added starts it again. The renewals of
    one store are one statement (``renew_many``, where the store has it): a thread that
    contends with a busy loop for the interpreter lock waits for it once per statement,
    not once per run. A renewal refused as stale marks that lease lost
    (``Heartbeat._refused``)."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._early = ttl / 6
        self._guard = threading.Condition()
        self._beats: dict[TaskHeartbeat, None] = {}  # in the order added: oldest due first
        self._thread: threading.Thread | None = None

    def add(self, beat: TaskHeartbeat) -> None:
        with self._guard:
            self._beats[beat] = None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="crashproof-leases", daemon=True
                )
                self._thread.start()

    def discard(self, beat: TaskHeartbeat) -> None:
        with self._guard:
            self._beats.pop(beat, None)

    def _run(self) -> None:
        while True:
            with self._guard:
                while True:
                    if not self._beats:
                        self._thread = None
                        return
                    wait = next(iter(self._beats)).due - time.monotonic()
                    if wait <= 0:
                        break
                    self._guard.wait(wait)
                due = _due(self._beats, time.monotonic() + self._early)
            kept = _renew_all(due)
            with self._guard:
                for beat, alive in zip(due, kept, strict=True):
                    if beat not in self._beats:
                        continue  # stopped meanwhile
                    del self._beats[beat]
                    if alive:  # to the end of the line: due last now
                        beat.due = time.monotonic() + self._ttl / 3
                        self._beats[beat] = None


def _due(beats: dict[TaskHeartbeat, None], horizon: float) -> list[TaskHeartbeat]:
    """The heartbeats due by ``horizon`` (in due order: the first ones)."""
    return list(itertools.takewhile(lambda beat: beat.due <= horizon, beats))


def _renew_all(beats: list[TaskHeartbeat]) -> list[bool]:
    """Renew ``beats``: whether each is still to be renewed (``Heartbeat._renew``)."""
    kept: dict[TaskHeartbeat, bool] = {}
    by_store: dict[int, list[TaskHeartbeat]] = {}
    for beat in beats:
        if beat.drive is not None and beat.drive.ended:
            kept[beat] = False
        else:
            by_store.setdefault(id(beat._store), []).append(beat)
    for group in by_store.values():
        many = getattr(group[0]._store, "renew_many", None)
        if many is None or len(group) == 1:
            kept.update((beat, beat._renew()) for beat in group)
            continue
        try:
            renewed = many([(beat._run_id, beat.lease) for beat in group])
        except Exception as exc:  # e.g. the database is briefly unreachable: try again
            log.warning("lease renewals failed: %s (%d runs)", exc, len(group))
            kept.update((beat, True) for beat in group)
            continue
        for beat in group:
            lease = renewed.get(beat._run_id)
            if lease is not None:
                beat.lease = lease
            kept[beat] = True if lease is not None else beat._refused()
    return [kept[beat] for beat in beats]


_RENEWALS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, _Renewals]] = (
    weakref.WeakKeyDictionary()
)
_RENEWALS_LOCK = threading.Lock()


def _renewals(loop: asyncio.AbstractEventLoop, ttl: float) -> _Renewals:
    with _RENEWALS_LOCK:
        by_ttl = _RENEWALS.setdefault(loop, {})
        found = by_ttl.get(ttl)
        if found is None:
            found = by_ttl[ttl] = _Renewals(ttl)
        return found


def claim(
    store: Store, run_id: str, owner: str, ttl: float, take_over: bool, wait: float = 0.0
) -> Grant:
    """Claim the run's lease for ``owner``; a holder that is provably gone is taken over.
    ``wait``: seconds to keep trying while another worker holds it (then LeaseHeld)."""
    # Listed before the claim, so that no other Ledger of this process ever sees
    # this lease in the store and takes it for abandoned.
    _start_driving(owner, run_id)
    try:
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            try:
                return _claim_once(store, run_id, owner, ttl, take_over)
            except LeaseHeld as held:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                # Poll: the holder may release before its lease runs out.
                until_expiry = (held.expires_at or 0.0) - time.time()
                time.sleep(min(left, _WAIT_POLL, max(0.01, until_expiry)))
    except BaseException:
        with DRIVING_LOCK:
            DRIVING.discard((owner, run_id))
        raise


def first(owner: str, run_id: str, ttl: float) -> Lease:
    """The lease a run is created under by the drive that starts it (``Store.create_run``:
    fencing token 1, as its first claim would leave it), listed as driving first, as
    ``claim`` does; ``stop_driving`` when the run turns out to exist already."""
    _start_driving(owner, run_id)
    return Lease(owner, 1, time.time() + ttl, ttl)


def adopt(run_id: str, lease: Lease) -> Grant:
    """Drive ``run_id`` under a lease its owner claimed already (a worker's claim from the
    queue, which bumped the fencing token): listed as driving, as ``claim`` does, with no
    second claim (a durable transaction and a token increment saved per queued run)."""
    _start_driving(lease.owner, run_id)
    return Grant(lease)


def _start_driving(owner: str, run_id: str) -> None:
    with DRIVING_LOCK:
        if (owner, run_id) in DRIVING:
            # Another thread of this Ledger drives the run right now: a second driver
            # would look an in-flight act up, find nothing yet, and execute it again.
            raise LeaseHeld(
                f"run {run_id!r} is being driven by this ledger in another thread "
                f"(worker {owner}); wait for it to finish",
                owner=owner,
            )
        DRIVING.add((owner, run_id))


def _claim_once(store: Store, run_id: str, owner: str, ttl: float, take_over: bool) -> Grant:
    try:
        return Grant(store.claim(run_id, owner, ttl, take_over=take_over))
    except LeaseHeld as held:
        if held.owner is None or not abandoned(held.owner, run_id):
            raise
        log.info("taking over an abandoned lease", extra={"run_id": run_id, "owner": held.owner})
        # From that holder only: of two claimants finding it gone, one takes the run and
        # the other meets the winner's lease (one model call, not two, then a fence).
        taken = store.claim(run_id, owner, ttl, take_over=held.owner)
        return Grant(taken, _gone(held.owner))


def release(store: Store, run_id: str, lease: Lease) -> None:
    try:
        store.release(run_id, lease)
    except CrashproofError as exc:  # the lease expires anyway
        log.warning("lease release failed: %s", exc, extra={"run_id": run_id})


@contextmanager
def operator_lease(
    store: Store, run_id: str, owner: str, ttl: float, *, take_over: bool = False
) -> Iterator[Lease]:
    """The run's lease for an operator's short write (a decision, a cancel, findings):
    released after it and after an error; a crash inside (a BaseException) leaves it to
    expire, as a dead process's would. ``take_over``: fence out whoever drives it."""
    lease = claim(store, run_id, owner, ttl, take_over).lease
    try:
        yield lease
    except BaseException as exc:
        stop_driving(lease.owner, run_id)
        if isinstance(exc, Exception):
            release(store, run_id, lease)
        raise
    stop_driving(lease.owner, run_id)
    release(store, run_id, lease)


def stop_driving(owner: str, run_id: str) -> None:
    """Forget that ``owner`` drives ``run_id`` (whatever way the drive ended)."""
    with DRIVING_LOCK:
        DRIVING.discard((owner, run_id))
