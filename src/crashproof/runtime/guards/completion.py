"""Completion evidence: a run that requires checks ends ``succeeded`` only when the last
check of each required name passed at the environments the run leaves behind.

``@ledger.workflow("fix", completion=cp.Completion(require=["tests"]))``, or a policy's
``cp.Policy(..., completion=...)`` for every run bound to it (both: the union). When the workflow
returns, before its success is recorded, the journal is read (``evaluate``) and, for each
required name, the last ``ctx.check`` of that name (``runtime/steps/checks.py``) must

- exist, have passed, and have observed every environment it recorded without error and
  without a change while it ran;
- still describe the world: no act recorded after it left one of those environments in
  another state (``act 'edit:b.py' changed workspace /repo after the last passing
  'tests'``), nor changed an environment the check did not observe;
- and, observed once more now (``verify``), every one of those environments is still in
  the state the check saw: a step, another process or a person may have written there
  without an act.

Otherwise the run stops, resumable, in ``stopped`` with the reason ``unverified: ...``
and the evidence (``cp.Unverified``, a ``cp.RunStopped``): nothing is lost, and a resume
under code that checks again after its last change (a new ``ctx.check`` at the end of the
workflow runs live after the replayed calls) completes it. A verified success records the
evidence in its ``run_succeeded`` record: which check, at which seq, and what every
environment looked like then.

Limits: an act whose tool does not observe (an HTTP POST) changes nothing the checks
can see, so it is not counted against them; "the environments" are those of tools that
observe (``cp.Workspace``, ``GitTool``, ``HttpTool`` with ``observe_path``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from crashproof.errors import Unverified
from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType, StepKind, StepStatus
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.environment import observing
from crashproof.runtime.steps.handoff import Work
from crashproof.runtime.steps.outage import journal_stop
from crashproof.tools.port import Tool

__all__ = ["Completion", "Verdict", "evaluate", "needed", "verify"]


@dataclass(frozen=True, slots=True)
class Completion:
    """What a run must have verified before it may end ``succeeded``: the names of the
    checks (``ctx.check(name, ...)``) whose last run must have passed at the final state
    of every environment the run acted on."""

    require: tuple[str, ...]

    def __init__(self, require: Iterable[str]) -> None:
        names = (require,) if isinstance(require, str) else tuple(require)
        if not names:
            raise ValueError("cp.Completion(require=[...]) needs at least one check name")
        for name in names:
            if not isinstance(name, str) or not name or "#" in name:
                raise ValueError(
                    f"cp.Completion: {name!r} is not a check name (a non-empty string "
                    "without '#', as passed to ctx.check)"
                )
        object.__setattr__(self, "require", names)


def needed(*declared: Completion | None) -> Completion | None:
    """What a run must verify: the union of its workflow's and its policy's requirements."""
    names = [name for c in declared if c is not None for name in c.require]
    return Completion(dict.fromkeys(names)) if names else None


@dataclass(frozen=True, slots=True)
class Verdict:
    """``evaluate``'s answer: the evidence per required check, and why it does not hold
    (empty: verified by the journal)."""

    checks: list[dict[str, Any]]
    problems: list[str]


def evaluate(events: Sequence[Event], require: Sequence[str]) -> Verdict:
    """The journal's verdict on ``require`` (pure: nothing is observed)."""
    last: dict[str, Event] = {}
    acts: list[tuple[Event, dict[str, Any]]] = []
    for event in events:
        if event.type is not EventType.STEP_DONE or event.key is None:
            continue
        payload = payloads.step_done(event)
        if payload["kind"] == StepKind.CHECK:
            last[event.key.split("#", 1)[0]] = event
        elif payload["kind"] == StepKind.ACT and payload.get("observed"):
            acts.append((event, payload["observed"]))
    checks: list[dict[str, Any]] = []
    problems: list[str] = []
    for name in require:
        found = last.get(name)
        if found is None:
            problems.append(f"no check {name!r} was recorded")
            continue
        event = found
        why = _not_passing(name, event)
        if why is not None:
            problems.append(why)
            continue
        value = event.value
        environments = list(value.get("environments") or [])
        checks.append(
            {"name": name, "step": event.key, "seq": event.seq, "environments": environments}
        )
        problems.extend(_unobserved(name, environments))
        at_check = {e["instance"]: e["fingerprint"] for e in environments if "instance" in e}
        for act, observed in acts:
            if act.seq < event.seq:
                continue
            instance = str(observed.get("instance"))
            if instance not in at_check:
                problems.append(
                    f"act {act.key!r} changed {instance}, which the last passing {name!r} "
                    "did not observe"
                )
            elif observed.get("fingerprint") != at_check[instance]:
                problems.append(
                    f"act {act.key!r} changed {instance} after the last passing {name!r}"
                )
    return Verdict(checks=checks, problems=problems)


def verify(
    session: RunSession, completion: Completion, tools: Iterable[Tool]
) -> Work[dict[str, Any]]:
    """Before a success is recorded: the journal's verdict, then each verified
    environment observed once more through the drive's tools. Returns the evidence the
    ``run_succeeded`` record keeps; stops the run (``Unverified``) otherwise."""
    verdict = evaluate(session.journal(), completion.require)
    problems = list(verdict.problems)
    observed_now: dict[str, dict[str, Any]] = {}
    if not problems:
        by_name = {tool.name: tool for tool in tools}
        for check in verdict.checks:
            for env in check["environments"]:
                instance = env["instance"]
                if instance not in observed_now:
                    observed_now[instance] = yield from _observe_now(by_name.get(env["tool"]))
                now = observed_now[instance]
                if "error" in now:
                    problems.append(
                        f"{instance} cannot be observed now ({now['error']}), so the last "
                        f"passing {check['name']!r} is not known to describe it"
                    )
                elif (now["instance"], now["fingerprint"]) != (instance, env["fingerprint"]):
                    problems.append(
                        f"{instance} changed after the last passing {check['name']!r}, "
                        "not by an act of this run"
                    )
    evidence = {"require": list(completion.require), "checks": verdict.checks}
    if problems:
        _stop(session, problems, {**evidence, "observed_now": observed_now})
    return evidence


def _not_passing(name: str, event: Event) -> str | None:
    payload = payloads.step_done(event)
    if payload["status"] != StepStatus.SUCCEEDED:
        error = payload.get("error") or {}
        return f"the last {name!r} check ({event.key}) raised {error.get('type', '?')}"
    value = event.value
    if not isinstance(value, dict) or value.get("passed") is not True:
        summary = str(value.get("summary", "")) if isinstance(value, dict) else ""
        tail = summary.strip().splitlines()[-1:] if summary.strip() else []
        return f"the last {name!r} check ({event.key}) failed" + (f": {tail[0]}" if tail else "")
    return None


def _unobserved(name: str, environments: list[dict[str, Any]]) -> list[str]:
    problems = []
    for env in environments:
        if "error" in env:
            message = (env["error"] or {}).get("message", "")
            problems.append(
                f"the last passing {name!r} could not observe tool {env.get('tool')!r} ({message})"
            )
        elif env.get("changed_during"):
            problems.append(f"{env['instance']} changed while {name!r} ran")
    return problems


def _observe_now(tool: Tool | None) -> Work[dict[str, Any]]:
    if tool is None:
        return {"error": "its tool was not handed to this drive"}
    try:
        now = yield from observing(tool)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if now is None:
        return {"error": "it observed nothing"}
    return {"instance": now.instance, "fingerprint": now.fingerprint, "version": now.version}


def _stop(session: RunSession, problems: list[str], evidence: dict[str, Any]) -> NoReturn:
    reason = "unverified: " + "; ".join(problems)
    exc = Unverified(session.run_id, reason, problems=problems)
    journal_stop(
        session, None, exc, {"completion": evidence, "problems": problems, "next_kind": "check"}
    )
    raise exc
