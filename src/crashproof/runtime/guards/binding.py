"""What a run is bound to beyond its input: limits and policy, recorded at start, checked
on every drive, changed only by journaled, attributable operator actions.

- ``run_started`` records ``limits`` (``cp.Limits.to_json()``) and ``policy`` (version,
  digest of its declarative part, identity) when the run was given them.
- Every drive (``Ledger.run`` of an existing run, ``Ledger.resume``) needs the same
  policy: the one passed in ``RunOptions`` or, failing that, the policy of the recorded
  version registered with the ledger (``Ledger.register_policy``; the CLI registers
  every ``cp.Policy`` found in its ``--app`` modules). Another version, the same version
  with another content (digest), or no policy at all refuses with ``cp.PolicyMismatch``
  before anything runs — unless the caller re-binds the run, which journals a
  ``policy_rebound`` record (who, host, when, old and new binding).
- Limits given to ``Ledger.run`` for an existing run must be the ones it started with;
  they change only through ``Ledger.resume(run_id, raise_budget=...)``, which journals a
  ``budget_raised`` record (who, host, when, old and new limits).
- A ``stopped`` run whose limits are still reached stays stopped: ``RunStopped`` is
  raised again and nothing is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crashproof.errors import CrashproofError, PolicyMismatch, RunCancelled
from crashproof.journal import payloads
from crashproof.journal.fold import Replay, index_journal, spend
from crashproof.journal.records import Budget, Event, EventType, Limits, RunStatus
from crashproof.runtime.driving.retrying import retried_record
from crashproof.runtime.guards.budget import (
    budget_raised,
    operator,
    raise_limits,
    reached,
    stopped_error,
)
from crashproof.runtime.guards.policy import Policy, made_in_this_process
from crashproof.runtime.options import RunOptions
from crashproof.runtime.steps.holds import intent_override
from crashproof.store.port import StatusChange

__all__ = ["LimitsMismatch", "OperatorChanges", "bind_run", "ended_run", "start_fields"]

Commit = Callable[[Sequence[Event], StatusChange | None], None]


class LimitsMismatch(CrashproofError):
    """The limits a drive passes are not the ones the run started with; nothing ran."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorChanges:
    """What a ``resume`` asks to change before driving the run."""

    raise_budget: Mapping[str, Any] | None = None
    rebind_policy: Policy | None = None
    # Runs holding the frozen act's intent that it may pass (steps/holds.py).
    override_intent: tuple[str, ...] = ()
    retry: bool = False  # re-drive a failed run (runtime/driving/retrying.py)
    by: str | None = None

    def __bool__(self) -> bool:
        return (
            bool(self.raise_budget)
            or self.rebind_policy is not None
            or bool(self.override_intent)
            or self.retry
        )


def start_fields(options: RunOptions | None) -> dict[str, Any]:
    """What ``run_started`` records of the run's options (nothing when there are none)."""
    if options is None:
        return {}
    if not isinstance(options, RunOptions):
        raise TypeError(f"options must be a cp.RunOptions, not {type(options).__name__}")
    fields: dict[str, Any] = {}
    if options.limits is not None:
        fields["limits"] = options.limits.to_json()
    if options.policy is not None:
        fields["policy"] = options.policy.record()
    return fields


def bind_run(
    run_id: str,
    events: list[Event],
    replay: Replay,
    *,
    options: RunOptions | None,
    changes: OperatorChanges | None,
    policies: Mapping[str, Policy],
    commit: Commit,
) -> tuple[Replay, Policy | None]:
    """Check (and, for operator changes, journal) the run's limits and policy; return the
    replay to drive and the policy to enforce. Raises before writing anything when the
    call does not fit the run. A run that will not execute (ended, or frozen for a
    human) needs no policy: its recorded outcome is answered as is."""
    outcome = replay.outcome
    runs = (
        outcome is None
        or bool(changes and changes.retry)  # a failed run, re-driven
        or outcome.type is EventType.RUN_STOPPED
        or (
            outcome.type is EventType.RUN_FROZEN
            and bool(payloads.run_frozen(outcome).get("retryable"))
        )
    )
    rebind = changes.rebind_policy if changes else None
    policy = rebind
    if runs:
        _check_limits(run_id, replay, options)
        if rebind is None:
            policy = _policy_for(run_id, replay, options, policies)
    if changes:
        added = _journal_changes(run_id, replay, changes, commit)
        if added:
            replay = index_journal([*events, *added])
    if outcome is not None and outcome.type is EventType.RUN_STOPPED:
        limits = Limits.from_json(replay.limits)
        used = Budget()
        for event in replay.done:
            used = spend(used, payloads.step_done(event))
        elapsed = time.time() - replay.started.created_at
        # The same check the call that did not start will meet when the replay reaches it.
        call = str((payloads.run_stopped(outcome).get("evidence") or {}).get("next_kind", "decide"))
        kind = reached(limits, used, elapsed, call)
        if kind is not None:
            raise stopped_error(run_id, kind, limits, used, elapsed)
    return replay, policy


def _check_limits(run_id: str, replay: Replay, options: RunOptions | None) -> None:
    if options is None or options.limits is None:
        return
    started = Limits.from_json(payloads.run_started(replay.started).get("limits"))
    if options.limits != started:
        raise LimitsMismatch(
            f"run {run_id!r} started with limits {started.to_json()}, this call passes "
            f"{options.limits.to_json()}; nothing was changed. Limits are fixed when a run "
            "starts: raise them with Ledger.resume(run_id, raise_budget=...) "
            "(CLI: crashproof resume RUN --raise-budget KIND=VALUE), which is journaled"
        )


def _policy_for(
    run_id: str, replay: Replay, options: RunOptions | None, policies: Mapping[str, Policy]
) -> Policy | None:
    recorded = replay.policy
    given = options.policy if options is not None else None
    if recorded is None:
        if given is None:
            return None
        raise PolicyMismatch(
            run_id,
            None,
            given.version,
            f"run {run_id!r} has no policy, but this call gives policy {given.version!r}; "
            "nothing was executed. Bind it explicitly: Ledger.resume(run_id, "
            "rebind_policy=policy, by=...) (journaled)",
        )
    version = str(recorded["version"])
    candidate = given if given is not None else policies.get(version)
    if candidate is None:  # made (imported) in this process with the recorded rules?
        candidate = made_in_this_process(version, str(recorded.get("digest")))
    if candidate is None:
        offered = ", ".join(sorted(policies)) or None
        raise PolicyMismatch(
            run_id,
            version,
            offered,
            f"run {run_id!r} is bound to policy {version!r}, but this process offers "
            f"{_versions(offered)}; nothing was executed. Make policy {version!r} in "
            "this process (import the module that builds its cp.Policy, or an --app "
            "module), or re-bind the "
            "run: Ledger.resume(run_id, rebind_policy=policy, by=...) / crashproof resume "
            "RUN --app MODULE --rebind-policy VERSION (journaled)",
        )
    if candidate.version != version:
        raise PolicyMismatch(
            run_id,
            version,
            candidate.version,
            f"run {run_id!r} is bound to policy {version!r}, this call gives policy "
            f"{candidate.version!r}; nothing was executed. Re-bind the run explicitly: "
            "Ledger.resume(run_id, rebind_policy=policy, by=...) (journaled)",
        )
    if candidate.digest != recorded.get("digest"):
        raise PolicyMismatch(
            run_id,
            version,
            candidate.version,
            f"policy {version!r} changed since run {run_id!r} was bound to it (digest "
            f"{recorded.get('digest')} then, {candidate.digest} now); nothing was "
            "executed. Give changed rules a new version, and re-bind the run to it "
            "explicitly: Ledger.resume(run_id, rebind_policy=policy, by=...)",
        )
    return candidate


def _versions(offered: str | None) -> str:
    return "no policy" if offered is None else f"policy {offered}"


def ended_run(run_id: str, status: str) -> CrashproofError:
    """The refusal of an operator change to a run that has ended."""
    if status == RunStatus.CANCELLED.value:
        return RunCancelled(run_id)  # never driven again, whatever changes
    return CrashproofError(
        f"run {run_id!r} has ended ({status}); its budget and policy can no longer "
        "change, and nothing was changed"
    )


def _journal_changes(
    run_id: str, replay: Replay, changes: OperatorChanges, commit: Commit
) -> list[Event]:
    outcome = replay.outcome
    who = operator(changes.by)
    added: list[Event] = []
    seq = replay.next_seq
    if changes.retry:  # first: the other changes then apply to a run that runs again
        retried = retried_record(run_id, replay, who)  # refused unless failed
        commit((retried,), (RunStatus.RUNNING, None))
        added.append(retried)
        seq += 1
    elif outcome is not None and outcome.type in (EventType.RUN_SUCCEEDED, EventType.RUN_FAILED):
        raise ended_run(run_id, outcome.type.value.removeprefix("run_"))
    if changes.raise_budget:
        old = Limits.from_json(replay.limits)
        new = raise_limits(old, changes.raise_budget)
        if new != old:
            added.append(budget_raised(run_id, seq, old, new, who))
            seq += 1
    rebind = changes.rebind_policy
    if rebind is not None and replay.policy != rebind.record():
        added.append(
            Event(
                run_id=run_id,
                seq=seq,
                type=EventType.POLICY_REBOUND,
                key=None,
                payload={**who, "old": replay.policy, "new": rebind.record()},
                created_at=time.time(),
            )
        )
    if changes.override_intent:
        added.append(intent_override(run_id, seq, replay, changes.override_intent, who))
        seq += 1
    for event in added[1 if changes.retry else 0 :]:  # one commit each: one decision each
        commit((event,), None)
    return added
