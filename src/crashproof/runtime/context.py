"""The Context a workflow receives: every non-deterministic or effectful call goes through it.

Replay: on resume the workflow runs again from the top. Each ctx call takes the
next step key (``name``, ``name#2``, ...) and is matched, in order, with the next
recorded step of the journal: same key, same kind, same arguments digest. A
match returns the recorded value (or raises the recorded error) without running
anything. A mismatch freezes the run in ``needs_review`` and raises
NonDeterminismError. Past the end of the journal, calls run live and are recorded.
"""

from __future__ import annotations

import datetime as dt
import random as _random
import uuid as _uuid
from collections.abc import Callable, Iterable
from types import GeneratorType
from typing import Any, TypeVar

from crashproof.errors import ActNotDone, CrashproofError
from crashproof.journal import payloads, records
from crashproof.journal.codec import decode, encode, error_from_record, storable
from crashproof.journal.fold import Replay
from crashproof.journal.records import Event, EventType, StepKind, StepStatus
from crashproof.runtime.driving.commits import is_failure
from crashproof.runtime.driving.drive_records import DriveRecords
from crashproof.runtime.driving.durability import Pending
from crashproof.runtime.guards.budget import Meter
from crashproof.runtime.guards.policy import Policy, admit_act, admit_in_flight
from crashproof.runtime.guards.replan import decided_epoch
from crashproof.runtime.options import StepOptions
from crashproof.runtime.port import ActSettings, DriveHost
from crashproof.runtime.steps.act_records import intent_digest
from crashproof.runtime.steps.acts import perform_act
from crashproof.runtime.steps.arguments import ArgumentDigests
from crashproof.runtime.steps.checks import CheckResult, checking
from crashproof.runtime.steps.environment import WorldCheck
from crashproof.runtime.steps.handoff import Work, async_methods, async_tool_refused, run_sync
from crashproof.runtime.steps.live import live_call
from crashproof.runtime.steps.matching import mismatch, patch_marker
from crashproof.runtime.steps.outbox import deliver, enqueue
from crashproof.runtime.steps.reconcile import ResumeReread
from crashproof.tools.port import Tool

__all__ = ["Context"]


def _no_crash_point(name: str) -> None: ...


T = TypeVar("T")

_BUDGETED = (StepKind.STEP, StepKind.DECIDE, StepKind.CHECK)  # acts: metered in ``act``
_UNGATED = (StepKind.NOW, StepKind.RANDOM, StepKind.UUID)  # reach nothing outside
_SUCCEEDED = StepStatus.SUCCEEDED.value
_STEP_DONE = EventType.STEP_DONE
# What errors name, per kind (formatted with the key only when one is raised).
_ARGUMENTS_OF = {kind: f"arguments of {kind.value}" for kind in StepKind}
# A successful step's payload text up to its digest: codec.encode's exact bytes for
# {"kind", "digest", "status", "attempt", "took_us"} (built directly: tests pin it).
# Kept: ~1.0 µs of a ~16 µs live step, 6 % (A/B +6-8 %); bench/handbuilt.py, 2026-12-01.
_DONE_PREFIX = {kind: f'{{"kind":"{kind.value}","digest":"' for kind in StepKind}
_DONE_STATUS = f'","status":"{_SUCCEEDED}","attempt":'
_REPLAYS = f'","status":"{_SUCCEEDED}",'  # what a replayed success's text goes on with


class Context(DriveRecords):
    """Handed to a workflow function as its first argument. Implements the
    ``RunSession`` port (``runtime/port.py``) for the recorders and guards it calls."""

    def __init__(self, host: DriveHost, run_id: str, replay: Replay) -> None:
        self._host = host
        self.run_id = run_id
        self._done = replay.done
        self._cursor = 0
        self._failed_attempts = replay.failed_attempts
        self._open_acts = replay.open_acts
        self._undelivered = replay.undelivered
        self._next_seq = replay.next_seq
        self._counts: dict[str, int] = {}
        self._patches: dict[str, bool] = {}
        self._in_step: str | None = None
        self._nested_call = False  # a ctx call was attempted inside the running step body
        self.frozen: CrashproofError | None = None
        self.frozen_evidence: dict[str, Any] | None = None
        self.fencing_token: int | None = None
        self.ended = False  # the run's outcome is committed: its lease went with it
        # The error of the ledger that broke this drive's journal (``store_failed``):
        # nothing more is written or run by the drive.
        self.broken: BaseException | None = None
        self.act_settings: ActSettings = host.act_settings
        self.call_scopes = host.call_scopes  # entered around live calls (steps/scopes.py)
        self._clock = host.store.clock.clock  # this host's clock (a test may skew it)
        self.server_clock = host.store.clock.is_server  # Store.now is a server's clock
        # Budgets and policy: checked before new work only (runtime/guards/budget.py, policy.py).
        self.meter: Meter = Meter(replay)
        self.policy: Policy | None = None
        self.world = WorldCheck(replay)  # re-observed before the first live call
        self.arguments = ArgumentDigests(self._done)  # growing lists digested incrementally
        # A decision's request stored with it, as a delta (runtime/operations/requests.py).
        self.keeps = StepKind.DECIDE if host.store_requests else None
        self.reread = ResumeReread(replay)  # receipts looked up again, then too
        self.session: dict[str, Any] | None = None  # put in this drive's first record
        self.versions: dict[str, str | None] = {}  # workflow and policy: set by the ledger
        self.last_key: str | None = None  # of the latest step, decision or act begun
        self.handed: dict[int, Tool] = {}  # tools of acts and checks: what a check observes
        # An async drive's records, committed before its next handoff (Pending); None:
        # committed at once (the sync shell).
        self.pending: Pending | None = None

    # -- the public calls (the sync shell: runtime/async_context.py is the other) ----

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        options: StepOptions | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once; record its JSON result; replay it afterwards."""
        work = self.begin_call(StepKind.STEP, name, fn, args, kwargs, options)
        return run_sync(work) if type(work) is GeneratorType else work  # type: ignore[no-any-return]

    def decide(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        options: StepOptions | None = None,
        **kwargs: Any,
    ) -> Any:
        """Ask a model (or anything that decides) once. ``fn`` may return a ``cp.Decision``
        to record model, usage and cost. A recorded decision is never asked again."""
        work = self.begin_call(StepKind.DECIDE, name, fn, args, kwargs, options)
        return run_sync(work) if type(work) is GeneratorType else work

    def act(self, name: str, tool: Tool, /, **params: Any) -> Any:
        """Perform a side effect through ``tool`` under the act protocol; returns the
        receipt's result. Its operation id is ``run_id/step_key``: the same on every
        attempt and in every process, so the tool can dedupe and look it up."""
        methods = async_methods(tool)
        if methods:  # refused before anything, on replay too (its receipts are re-read)
            raise async_tool_refused(tool, name, methods)
        work = self.begin_act(name, tool, params)
        return run_sync(work) if type(work) is GeneratorType else work

    def begin_act(self, name: str, tool: Tool, params: dict[str, Any]) -> Any:
        """The act's recorded result when replay returns it, else the work to drive (a
        generator: ``handoff.run_sync`` or ``run_async``)."""
        self._check_usable()
        key = self.last_key = self._take_key(name)
        digest = intent_digest(tool, params, key)
        self.handed.setdefault(id(tool), tool)
        recorded = self._peek()
        if recorded is not None:
            if self.world.pending:
                self.world.seen(key, tool)
            last = False
            if self.reread.pending:
                self.reread.seen(key, tool)
                # (An act in flight is next, live: its gate re-reads, seeing its tool.)
                last = self._cursor == self.reread.last_act and not self._open_acts
            result = self._replay(recorded, key, StepKind.ACT, digest)
            if last or key in self._undelivered:
                return self._replayed_last(result, key, tool, params, digest, last)
            return result
        return self._live_act(key, tool, params, digest)

    def _replayed_last(
        self, result: Any, key: str, tool: Tool, params: dict[str, Any], digest: str, last: bool
    ) -> Work[Any]:
        """``last``: the journal's last act just replayed, so the receipts are re-read now,
        while the body still holds its tools (one that closes its connection in
        ``finally`` may return before the run's outcome, the re-read's other moment).
        An act committed but never delivered is delivered then."""
        if last:  # before a freeze, the environment's check, as at a live call's gate
            yield from self.reread.check(self, lambda: self.world.check(self))
        if key in self._undelivered:  # committed, never delivered: deliver it now
            return (yield from self._deliver(result, key, tool, params, digest))
        return result

    def _deliver(
        self, result: Any, key: str, tool: Tool, params: dict[str, Any], digest: str
    ) -> Work[Any]:
        self._undelivered.pop(key, None)
        yield from self.world.check(self)
        yield from deliver(self.append_event, self.run_id, key, tool, params, digest)
        return result

    def _live_act(self, key: str, tool: Tool, params: dict[str, Any], digest: str) -> Work[Any]:
        yield from self._before_live(key, StepKind.ACT, tool)
        if key in self._open_acts:  # frozen for review, then decided? (runtime/guards/review.py)
            try:
                decided = yield from decided_epoch(self, key, tool, digest)
            except ActNotDone:  # kept by a reviewer: recorded as not done, the run goes on
                self._open_acts.pop(key)
                raise
            if decided is not None:
                self._open_acts.pop(key)
                epoch, events = decided
                return (yield from perform_act(self, key, tool, params, digest, events, epoch))
        approval = None  # the one it consumed, when the policy wants one (guards/approvals.py)
        if key not in self._open_acts:  # new work; an act in flight is reconciled first
            self.meter.check(self, key, StepKind.ACT)
            if self.policy is not None:
                approval = yield from admit_act(self, self.policy, key, tool, params, digest)
        elif self.policy is not None:
            approval = yield from admit_in_flight(self, self.policy, key, tool, digest)
        if tool.deferred:
            return (yield from enqueue(self, key, tool, params, digest))
        open_events = self._open_acts.pop(key, [])
        return (yield from perform_act(self, key, tool, params, digest, open_events, 1, approval))

    def check(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        on: Iterable[Tool] = (),
        options: StepOptions | None = None,
        **kwargs: Any,
    ) -> CheckResult:
        """Run the task's own check (tests, a build) once, like a step; record its verdict
        with the environments of ``on`` and of every tool acted on (``steps/checks.py``)."""
        work = self.begin_call(
            StepKind.CHECK, name, checking(name, fn, on, self.handed), args, kwargs, options
        )
        return CheckResult.from_json(run_sync(work) if type(work) is GeneratorType else work)

    def now(self) -> dt.datetime:
        """The current UTC time, recorded: replay returns the same instant."""
        iso = self._recorded(StepKind.NOW, "now", lambda: dt.datetime.now(dt.UTC).isoformat())
        return dt.datetime.fromisoformat(iso)

    def random(self) -> float:
        """A random float in [0, 1), recorded."""
        value: float = self._recorded(StepKind.RANDOM, "random", _random.random)
        return value

    def uuid(self) -> _uuid.UUID:
        """A random UUID4, recorded."""
        return _uuid.UUID(self._recorded(StepKind.UUID, "uuid", lambda: str(_uuid.uuid4())))

    def _recorded(self, kind: StepKind, name: str, fn: Callable[[], Any]) -> Any:
        """A clock or random value: no I/O, so both shells take it synchronously."""
        work = self.begin_call(kind, name, fn, (), {}, None)
        return run_sync(work) if type(work) is GeneratorType else work

    def patched(self, change_id: str) -> bool:
        """True for runs that reach this point under the new code, False for runs that
        passed it before the change was deployed. Use it to branch around in-flight runs:
        ``if ctx.patched("use-v2-prompt"): ... else: ...`` (the answer is fixed per run)."""
        if change_id in self._patches:
            return self._patches[change_id]
        self._check_usable()
        name = f"patched:{change_id}"
        recorded = self._peek()
        if recorded is None and (self._open_acts or self._failed_attempts_pending()):
            # The journal ends inside a call the old code had already started (an act in
            # flight, a step between retries): the run passed this point under old code.
            answer = False
        elif recorded is None:  # live: the new code is here first
            self._record_marker(name)
            answer = True
        elif (
            recorded.key == self._key_for(name)
            and payloads.step_done(recorded)["kind"] == StepKind.PATCHED
        ):
            self._take_key(name)
            self._cursor += 1
            answer = True
        else:  # the run went past this point before the patch existed
            answer = False
        self._patches[change_id] = answer
        return answer

    # -- matching and recording --------------------------------------------

    def begin_call(
        self,
        kind: StepKind,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: StepOptions | None,
    ) -> Any:
        """The call's recorded outcome when replay returns it, else the work to drive (a
        generator: ``handoff.run_sync`` or ``run_async``)."""
        if (
            self.frozen is not None
            or self._in_step is not None
            or self._host.draining
            or self.broken is not None
        ):
            self._check_usable()  # raises (every replayed call comes here: checked inline)
        n = self._counts.get(name)  # _take_key, inlined
        if n is None:
            key = self._take_key(name)  # a new name: validated
        else:
            self._counts[name] = n = n + 1
            key = f"{name}#{n}"
        self.last_key = key
        cursor = self._cursor
        recorded = self._done[cursor] if cursor < len(self._done) else None
        # In the recorded call's format; growing lists incrementally (steps/arguments.py).
        if kind is self.keeps:  # its request stored: built live, its base kept on replay
            digest = self.arguments.keeping(name, args, kwargs, _ARGUMENTS_OF[kind], key, recorded)
        else:
            digest = self.arguments.of(name, args, kwargs, _ARGUMENTS_OF[kind], key, recorded)
        if recorded is not None:
            # The usual replay: an exact match that succeeded, read from the start of the
            # stored text without decoding it (every payload the runtime writes begins
            # with kind, digest and status, in this order). Anything else, including
            # another field order, goes to _replay's full match on the decoded payload.
            # Kept: ~1.15 µs of a ~4 µs replayed step, 28 % (A/B +35-41 %; handbuilt.py).
            text = recorded.payload_json
            if (
                recorded.key == key
                and text is not None
                and text.startswith(f"{_DONE_PREFIX[kind]}{digest}{_REPLAYS}")
            ):
                self._cursor = cursor + 1
                value_json = recorded.value_json
                return None if value_json is None else decode(value_json)
            return self._replay(recorded, key, kind, digest)
        return self._live(kind, key, fn, args, kwargs, digest, options)

    def _live(
        self,
        kind: StepKind,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        digest: str,
        options: StepOptions | None,
    ) -> Work[Any]:
        if self.world.pending or self._open_acts or self.reread.pending:
            yield from self._before_live(key, kind)
        if self.meter.active and kind in _BUDGETED and key not in self._failed_attempts:
            self.meter.check(self, key, kind)  # (not for a retry in progress)
        return (yield from live_call(self, kind, key, fn, args, kwargs, digest, options))

    def _replay(self, recorded: Event, key: str, kind: StepKind, digest: str) -> Any:
        """The recorded outcome of a matching call; nothing runs."""
        self._cursor += 1
        self._match(recorded, key, kind, digest)
        payload = payloads.step_done(recorded)
        if payload["status"] == StepStatus.SUCCEEDED:
            return recorded.value
        raise error_from_record(payload["error"])

    def _before_live(self, key: str, kind: StepKind, tool: Tool | None = None) -> Work[None]:
        """The one gate before any call runs live (a step, a decision, an act, new or
        reconciled): once per drive the environment is observed again and the completed
        acts' receipts are re-read (``runtime/steps/environment.py``, ``reconcile.py``),
        then an act left in flight must be this very call. ``tool``: the act's. A clock
        or random value reaches nothing outside: it waits for the next call's gate."""
        if kind not in _UNGATED:
            if self.world.pending:
                yield from self.world.check(self, key, tool)
            if self.reread.pending:
                if tool is not None:  # an act in flight may have overwritten earlier ones
                    self.reread.seen(key, tool)
                yield from self.reread.check(self)
        self._check_open_acts(key)

    def _check_open_acts(self, key: str) -> None:
        """An act left in flight must be reconciled by the same call, not skipped."""
        if self._open_acts and key not in self._open_acts:
            pending = next(iter(self._open_acts))
            self.freeze(
                f"non-determinism: act {pending!r} is in flight in the journal, but the code "
                f"now makes {key!r} instead; the in-flight act is not abandoned",
                {"in_flight": pending, "actual": key},
                key=pending,
            )

    # -- the StepSession port (runtime/steps/live.py) ------------------------

    def earlier_attempts(self, key: str) -> list[Event] | None:
        return self._failed_attempts.get(key)

    def enter_step(self, key: str) -> None:
        self._in_step = key
        self._nested_call = False

    def leave_step(self) -> bool:
        self._in_step = None
        return self._nested_call

    def record_done(
        self,
        kind: StepKind,
        key: str,
        digest: str,
        attempt: int,
        took_us: int,
        spent: dict[str, Any] | None,
        ended: float,
        value_json: str,
    ) -> None:
        # The payload's stored text, built directly: codec.encode's exact bytes of
        # {"kind", "digest", "status", "attempt", "took_us"} (+ a decision's spend).
        text = f'{_DONE_PREFIX[kind]}{digest}{_DONE_STATUS}{attempt},"took_us":{took_us}}}'
        if spent is not None:
            # codec.encode, not a text built by hand: that bought 0.23 µs of a ~19 µs
            # decision, 1.2 % (bench/handbuilt.py, 2026-12-01).
            extra = encode(spent, what="model/usage/cost of decision", key=key)
            text = f"{text[:-1]},{extra[1:]}"
        request = self.arguments.take_request(key) if kind is self.keeps else None
        sha = None if request is None else records.request_sha256(request)
        if sha is not None:  # kept beside the record, which holds its digest, last
            text = f'{text[:-1]},"request_sha256":"{sha}"}}'
        if self.session is None and not self.meter.active:
            # The usual live step: its payload dict is never needed (the record keeps the
            # text; anything that reads the payload decodes it), and a step's or a
            # decision's result is no output point (runtime/driving/durability.py).
            event = Event.stored(
                self.run_id, self._next_seq, _STEP_DONE, key, text, ended, value_json
            )
            self._commit((records.with_request(event, request),), None, False)
            self._next_seq += 1
            return
        # Budgets count it, or it opens a drive (its session added by append_event): the
        # payload as a dict too.
        done: payloads.StepDone = {
            "kind": kind._value_,
            "digest": digest,
            "status": _SUCCEEDED,
            "attempt": attempt,
            "took_us": took_us,
        }
        if spent is not None:  # a Decision's model, usage and cost, in this order
            done.update({"model": spent["model"], "usage": spent["usage"], "cost": spent["cost"]})
        if sha is not None:
            done["request_sha256"] = sha
        payload = payloads.as_dict(done)
        if self.session is not None:  # the drive's first record: append_event adds it
            self.append_event(EventType.STEP_DONE, key, payload, value_json, request=request)
            return
        event = Event.stored(
            self.run_id, self._next_seq, _STEP_DONE, key, text, ended, value_json, payload
        )
        event = records.with_request(event, request)
        self._commit((event,), None, False)
        self._next_seq += 1
        self.meter.count(payload)

    def _record_marker(self, name: str) -> None:
        self.append_event(EventType.STEP_DONE, self._take_key(name), patch_marker(), "true")

    def _match(self, recorded: Event, key: str, kind: StepKind, digest: str) -> None:
        found = mismatch(recorded, key, kind, digest)
        if found is not None:
            self.freeze(*found)

    def crash_point_for(self, key: str) -> Callable[[str], None]:
        """A crash-point hook for a tool working on act ``key``."""
        points = self._host.crash_points
        if points is None:
            return _no_crash_point
        return lambda name: points.hit(f"inside[act:{key}:{name}]")

    # -- the rest of the RunSession port ----------------------------------------

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def journal(self, run_id: str | None = None) -> list[Event]:
        """This run's verified journal, or another run's of this ledger (none: []). A
        read the ledger fails stops the drive (``store_failed``), wherever it is made
        from: never a call's outcome."""
        self.flush()  # an async drive reads what it wrote
        try:
            if run_id is None:
                return self._host.journal(self.run_id)
            if self._host.store.get_run(run_id) is None:
                return []
            return self._host.journal(run_id)
        except Exception as exc:
            if is_failure(exc):
                self.store_failed(exc)
            raise

    def unreplayed(self) -> list[Event]:
        """Recorded steps (and acts in flight) the workflow has not reached: non-empty
        when the workflow returns means the code changed under the run."""
        in_flight = [events[0] for events in self._open_acts.values() if events]
        return self._done[self._cursor :] + in_flight

    # -- helpers -----------------------------------------------------------

    def _check_usable(self) -> None:
        if self.broken is not None:
            self.store_failed(self.broken)
        if self.frozen is not None:
            raise self.frozen
        self._host.check_driving(self.run_id)  # a draining worker stops here
        if self._in_step is not None:
            self._nested_call = True
            raise CrashproofError(
                f"ctx calls cannot be nested inside step {self._in_step!r}; "
                "call them from the workflow function"
            )

    def _failed_attempts_pending(self) -> bool:
        """Failed attempts of a step that has no final record yet."""
        done = {event.key for event in self._done}
        return any(key not in done for key in self._failed_attempts)

    def _peek(self) -> Event | None:
        return self._done[self._cursor] if self._cursor < len(self._done) else None

    def _key_for(self, name: str) -> str:
        if not isinstance(name, str) or not name or "#" in name:
            # "turn#2" as a name would share its key (and an act's operation id) with
            # the second call named "turn": two steps, one identity.
            raise CrashproofError(
                f"step name {name!r} is not allowed: use a non-empty string without '#' "
                "(crashproof appends '#n' to repeated names to keep step keys unique)"
            )
        if not storable(name):
            # A key no database can hold (PostgreSQL's text has no NUL; a lone surrogate
            # has no UTF-8): refused here, the same on every store, before any record.
            raise CrashproofError(
                f"step name {name!r} is not allowed: it holds a NUL character or a lone "
                "surrogate, which a ledger cannot store; name steps with UTF-8 text "
                "without NUL (pass data as arguments, not in the name)"
            )
        n = self._counts.get(name, 0) + 1
        return name if n == 1 else f"{name}#{n}"

    def _take_key(self, name: str) -> str:
        key = self._key_for(name)
        self._counts[name] = self._counts.get(name, 0) + 1
        return key

    def ledger_now(self) -> float:
        return self._host.store.now()
