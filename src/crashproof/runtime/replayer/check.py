"""Replay recorded runs against the current code without executing anything.

The check a team runs in CI before deploying new workflow code (as Temporal's replayer).
Each run's journal is fed to the workflow through a :class:`ReplayContext`: every ctx call
is matched with the journal exactly as on a real resume (same step key, same kind, same
arguments digest, and for acts the intent digest, which covers the tool's name and contract
version), but nothing ever runs: no step body, no model, no tool ``prepare``/``execute``/
``lookup``, no outbox delivery, and no write to any ledger. Past the end of the journal the
replay stops: a run still in flight is checked up to its end of journal.

A changed step argument is flagged (the arguments digest is part of every recorded step),
which a command-type replay (Temporal) or a name-only check (DBOS) misses.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from crashproof.errors import (
    WORKFLOW_OUTCOMES,
    CrashproofError,
    NonDeterminismError,
)
from crashproof.journal import payloads
from crashproof.journal.fold import index_journal
from crashproof.journal.records import Event, EventType, StepKind
from crashproof.runtime.async_context import AsyncContext
from crashproof.runtime.context import Context
from crashproof.runtime.port import DriveHost
from crashproof.runtime.replayer.contracts import contract_mapping, explain_contract_change
from crashproof.runtime.steps.act_records import intent_digest
from crashproof.runtime.steps.arguments import ArgumentDigests
from crashproof.runtime.workflow import Workflow
from crashproof.tools.port import Tool

__all__ = ["ReplayContext", "ReplayVerdict", "replay_events", "replay_runs"]

COMPATIBLE = "compatible"
NON_DETERMINISTIC = "non_deterministic"
REFUSED = "refused"  # the code would refuse to resume the run (version, unknown workflow)


class _EndOfJournal(BaseException):
    """The workflow went past the recorded journal: the replay check stops here.
    A BaseException so that a workflow's ``except Exception`` cannot swallow it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayVerdict:
    """The outcome of replaying one run. ``step`` is the 1-based position of the first
    mismatching call among the run's recorded steps; ``recorded``/``now`` describe it."""

    run_id: str
    workflow: str
    version: str
    status: str  # compatible | non_deterministic | refused
    detail: str
    replayed: int = 0  # recorded steps matched by the code
    recorded_steps: int = 0
    step: int | None = None
    key: str | None = None
    recorded: str | None = None
    now: str | None = None
    contract: str | None = None  # what a declared tool contract mapping says about it
    # With map_contracts: the acts a declared mapping maps (matched as mapped), and the
    # contract version of every tool the code called, by name.
    mapped: tuple[dict[str, Any], ...] = ()
    tools: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == COMPATIBLE

    def line(self) -> str:
        """One human line: ``RUN  compatible`` / ``non-deterministic at step K (...)``."""
        return f"{self.run_id}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "version": self.version,
            "status": self.status,
            "detail": self.detail,
            "replayed": self.replayed,
            "recorded_steps": self.recorded_steps,
            "step": self.step,
            "key": self.key,
            "recorded": self.recorded,
            "now": self.now,
            "contract": self.contract,
            **({"mapped": list(self.mapped)} if self.mapped else {}),
        }


def _describe(kind: str, key: str, digest: str) -> str:
    what = "intent" if kind == StepKind.ACT else "args"
    return f"{kind} {key!r} {what} {digest[:12]}"


class ReplayContext(Context):
    """A Context that only matches: every path that would run, record or call a tool
    raises ``_EndOfJournal`` (past the journal) or records a mismatch (frozen).
    ``map_contracts``: a recorded act whose tool contract changed matches when the tool's
    declared mapping maps its recorded params exactly to the code's (listed in ``mapped``:
    what a compatibility verdict would apply)."""

    def __init__(
        self, scratch: DriveHost, run_id: str, events: Sequence[Event], map_contracts: bool = False
    ) -> None:
        super().__init__(scratch, run_id, index_journal(events))
        # The on-demand check proves every list prefix (a drive's replay trusts the
        # journal for it: steps/arguments.py), so an in-place change on replay is found.
        self.arguments = ArgumentDigests(trusting=False)
        self._intents = {
            e.key: e for e in events if e.type is EventType.ACT_INTENT and e.key is not None
        }
        self.mismatch: dict[str, Any] | None = None
        self._tool_call: tuple[Tool, dict[str, Any]] | None = None
        self._map_contracts = map_contracts
        self.mapped: list[dict[str, Any]] = []
        self.tools: dict[str, str] = {}

    @property
    def replayed(self) -> int:
        """How many recorded steps the code has matched so far."""
        return self._cursor

    # -- matching without running ------------------------------------------

    def begin_call(
        self,
        kind: StepKind,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Any,
    ) -> Any:
        self._check_usable()
        key = self._take_key(name)
        recorded = self._peek()
        attempts = self._failed_attempts.get(key)
        against = recorded if recorded is not None else (attempts[-1] if attempts else None)
        digest = self.arguments.of(name, args, kwargs, f"arguments of {kind}", key, against)
        if recorded is not None:
            return self._replay(recorded, key, kind, digest)
        self._check_open_acts(key)
        if attempts and payloads.attempt_failed(attempts[-1]).get("digest") != digest:
            self._differs(len(self._done) + 1, key, kind.value, attempts[-1], digest)
        raise _EndOfJournal

    def begin_act(self, name: str, tool: Tool, params: dict[str, Any]) -> Any:
        self._check_usable()
        key = self._take_key(name)
        digest = intent_digest(tool, params, key)
        self.tools[tool.name] = tool.version
        recorded = self._peek()
        if recorded is not None:
            self._tool_call = (tool, params)
            return self._replay(recorded, key, StepKind.ACT, digest)  # no delivery, no tool
        self._check_open_acts(key)
        in_flight = self._open_acts.get(key)
        if in_flight:
            intents = [e for e in in_flight if e.type is EventType.ACT_INTENT]
            if intents and payloads.act_intent(intents[-1]).get("digest") != digest:
                self._tool_call = (tool, params)
                self._differs(len(self._done) + 1, key, StepKind.ACT.value, intents[-1], digest)
        raise _EndOfJournal

    def append_event(self, *args: Any, **kwargs: Any) -> None:
        raise _EndOfJournal  # the code wants to record something new: past the journal

    def freeze(
        self,
        reason: str,
        evidence: dict[str, Any],
        *,
        key: str | None = None,
        retryable: bool = False,
        error: type[CrashproofError] = NonDeterminismError,
    ) -> NoReturn:
        """Record the mismatch (nothing is written anywhere) and raise it into the code."""
        exc = NonDeterminismError(reason, evidence)
        if self.frozen is None:
            self.frozen, self.frozen_evidence = exc, evidence
            if self.mismatch is None:  # e.g. an act in flight the code no longer makes
                self.mismatch = {"step": self._cursor + 1, "reason": reason, **evidence}
        raise exc

    def _match(self, recorded: Event, key: str, kind: StepKind, digest: str) -> None:
        payload = payloads.step_done(recorded)
        if (
            recorded.key == key
            and payload["kind"] == kind.value
            and payload["digest"] == digest
            and payload["kind"] != StepKind.PATCHED
        ):
            self._tool_call = None
            return
        call = self._tool_call
        if self._map_contracts and call is not None and recorded.key == key:
            mapped = contract_mapping(call[0], self._intents.get(key), call[1], key)
            if mapped is not None and (mapped["from_digest"], mapped["to_digest"]) == (
                payload["digest"],
                digest,
            ):
                self.mapped.append(mapped)
                self._tool_call = None
                return
        self._differs(self._cursor, key, kind.value, recorded, digest)

    def _differs(self, step: int, key: str, kind: str, recorded: Event, digest: str) -> NoReturn:
        payload = payloads.step_record(recorded)  # a step_done, attempt_failed or act_intent
        old = _describe(str(payload["kind"]), str(recorded.key), str(payload["digest"]))
        new = _describe(kind, key, digest)
        contract = None
        call, self._tool_call = self._tool_call, None
        if call is not None and recorded.key == key and payload["kind"] == kind:
            contract = explain_contract_change(call[0], self._intents.get(key), call[1], key)
        self.mismatch = {
            "step": step,
            "key": recorded.key,
            "recorded": old,
            "now": new,
            "contract": contract,
        }
        self.freeze(
            f"non-determinism at {key!r}: the journal holds {old}, the code now makes {new}",
            {"expected": old, "actual": new, "seq": recorded.seq},
        )


def replay_events(
    workflow: Workflow[Any] | None,
    events: Sequence[Event],
    scratch: DriveHost,
    *,
    map_contracts: bool = False,
) -> ReplayVerdict:
    """Replay one run's verified journal against ``workflow`` (None: not in the code).
    ``scratch``: a ledger whose settings only are read (nothing is written to it);
    ``map_contracts``: see ReplayContext."""
    replay = index_journal(events)
    started = payloads.run_started(replay.started)
    run_id = events[0].run_id
    name, version = str(started.get("workflow")), str(started.get("version"))
    base: dict[str, Any] = {
        "run_id": run_id,
        "workflow": name,
        "version": version,
        "recorded_steps": len(replay.done),
    }
    if workflow is None:
        return ReplayVerdict(
            status=REFUSED,
            detail=f"refused: workflow {name!r} is not defined in the code replayed",
            **base,
        )
    if not workflow.can_resume(version):
        return ReplayVerdict(
            status=REFUSED,
            detail=(
                f"refused: the run started on version {version!r}, the code has version "
                f"{workflow.version!r} (compatible_with={list(workflow.compatible_with)})"
            ),
            **base,
        )
    ctx = ReplayContext(scratch, run_id, events, map_contracts)
    ended, problem = "reached the end of its journal", None
    try:
        _call_workflow(workflow, ctx, replay.started.value or {})
        ended = "returned"
    except _EndOfJournal:
        pass
    except Exception as exc:  # the workflow's own outcome, or a mismatch raised into it
        ended = "raised"
        outcome = replay.outcome
        if ctx.mismatch is not None:
            pass
        elif isinstance(exc, CrashproofError) and not isinstance(exc, WORKFLOW_OUTCOMES):
            # A resume would stop on it too (a non-JSON argument, a misused ctx...).
            problem = f"the code now raises {type(exc).__name__}: {exc}"
        elif outcome is not None and outcome.type is EventType.RUN_SUCCEEDED:
            problem = f"the recorded run succeeded, the code now raises {type(exc).__name__}"
    replayed = ctx.replayed
    base["mapped"], base["tools"] = tuple(ctx.mapped), tuple(sorted(ctx.tools.items()))
    if ctx.mismatch is not None:
        m = ctx.mismatch
        detail = f"non-deterministic at step {m['step']} ({m.get('reason') or ''})"
        if m.get("recorded") is not None:
            detail = (
                f"non-deterministic at step {m['step']} (recorded {m['recorded']}, "
                f"code now {m['now']})"
            )
        if m.get("contract"):
            detail += f"; {m['contract']}"
        return ReplayVerdict(
            status=NON_DETERMINISTIC,
            detail=detail,
            replayed=int(m["step"]) - 1,
            step=int(m["step"]),
            key=m.get("key"),
            recorded=m.get("recorded"),
            now=m.get("now"),
            contract=m.get("contract"),
            **base,
        )
    left = ctx.unreplayed() if ended != "reached the end of its journal" else []
    outcome = replay.outcome
    if left and problem is None:
        problem = (
            f"the code {ended} while {len(left)} recorded step(s) remain, first {left[0].key!r}"
        )
    elif ended == "returned" and outcome is not None and outcome.type is EventType.RUN_FAILED:
        problem = "the recorded run failed, the code now returns"
    if problem is not None:
        return ReplayVerdict(
            status=NON_DETERMINISTIC,
            detail=f"non-deterministic at step {replayed + 1} ({problem})",
            replayed=replayed,
            step=replayed + 1,
            key=left[0].key if left else None,
            **base,
        )
    return ReplayVerdict(
        status=COMPATIBLE,
        detail=f"compatible ({replayed} recorded step(s) replayed; the code {ended})",
        replayed=replayed,
        **base,
    )


def replay_runs(
    workflows: Iterable[Workflow[Any]],
    journals: Iterable[Sequence[Event]],
    scratch: DriveHost,
) -> list[ReplayVerdict]:
    """Replay every journal against the workflow of its name."""
    by_name = {wf.name: wf for wf in workflows}
    verdicts = []
    for events in journals:
        name = str(payloads.run_started(events[0]).get("workflow")) if events else ""
        verdicts.append(replay_events(by_name.get(name), events, scratch))
    return verdicts


def _call_workflow(workflow: Workflow[Any], ctx: ReplayContext, input: dict[str, Any]) -> None:
    """The workflow over ``ctx``: awaited on a loop of its own when it is async."""
    if not workflow.is_async:
        workflow.fn(ctx, **input)
        return

    async def drive() -> None:
        await workflow.fn(AsyncContext(ctx), **input)  # the shell made on the run's task

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the usual case (the CLI, a sync drive)
        asyncio.run(drive())
        return
    # Called from an async drive's verdict: a loop of its own, in a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, drive()).result()
