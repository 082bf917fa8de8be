"""Checks: the task's own verification (a test suite, a linter, a build) recorded as
evidence bound to the environments it saw.

``ctx.check(name, fn, *args, on=[...])`` runs ``fn`` once, like a step (retries, replay,
the same gate before it runs live), and records what it found together with what every
environment looked like while it ran: each tool of ``on`` and each tool this drive has
handed to ``ctx.act`` is observed just before ``fn`` and again just after. The recorded
value is the evidence::

    {"passed": bool, "summary": str,
     "environments": [{"tool", "instance", "fingerprint", "version", "changed_during"}]}

(an environment that could not be observed has ``"error"`` instead of a fingerprint).
``fn`` returns ``True``/``False`` or a ``cp.CheckResult``; an exception it raises is the
check's recorded error, as a step's would be. A failing check is a value, not an error:
the workflow reads ``result.passed`` and may edit and check again.

Observing before *and* after is what makes the evidence honest: a check that changed the
tree it was checking (a build writing into the workspace) says so (``changed_during``),
and a completion requirement (``runtime/guards/completion.py``) does not count it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from crashproof.journal.codec import error_record
from crashproof.tools.port import Observation, Tool

__all__ = ["SUMMARY_LIMIT", "CheckResult", "checking"]

# A summary is evidence for a person, kept in the journal: the end of a test run's output
# says what failed. Longer ones keep their last characters.
SUMMARY_LIMIT = 4000


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What a check found: ``passed``, a short ``summary`` (e.g. the end of the test
    output), and, once recorded, the ``environments`` it observed (read-only evidence).
    ``bool(result)`` is ``passed``."""

    passed: bool
    summary: str = ""
    environments: tuple[dict[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.passed, bool):
            raise TypeError(f"CheckResult.passed must be True or False, not {self.passed!r}")
        if not isinstance(self.summary, str):
            raise TypeError("CheckResult.summary must be a string")

    def __bool__(self) -> bool:
        return self.passed

    @classmethod
    def from_json(cls, value: Any) -> CheckResult:
        """The recorded evidence (``checking``'s value) as a result."""
        if not isinstance(value, dict) or not isinstance(value.get("passed"), bool):
            raise TypeError(f"not a recorded check: {value!r}")
        return cls(
            passed=value["passed"],
            summary=str(value.get("summary", "")),
            environments=tuple(value.get("environments") or ()),
        )


def checking(
    name: str, fn: Callable[..., Any], on: Iterable[Tool], handed: dict[int, Tool]
) -> Callable[..., Any]:
    """``fn`` wrapped so that its outcome is recorded as evidence, with the environments
    observed around it: those of ``on`` (added to ``handed``, the tools the drive was
    handed: a completion check observes them again) and of every tool in ``handed``. An
    ``async def`` ``fn`` gives a coroutine function (the async shell awaits it; plain
    observations run in a thread, off the loop)."""
    for tool in on:
        if not isinstance(tool, Tool):
            raise TypeError(f"ctx.check(on=...) takes cp.Tool objects, not {type(tool).__name__}")
        handed.setdefault(id(tool), tool)
    observed = [tool for tool in handed.values() if _observes(tool)]
    if inspect.iscoroutinefunction(fn):

        async def run_async(*args: Any, **kwargs: Any) -> dict[str, Any]:
            before = await _observe_all_async(observed)
            outcome = await fn(*args, **kwargs)
            return evidence(name, outcome, before, await _observe_all_async(observed))

        return run_async

    def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        before = _observe_all(observed)
        outcome = fn(*args, **kwargs)
        return evidence(name, outcome, before, _observe_all(observed))

    return run


def evidence(
    name: str, outcome: Any, before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> dict[str, Any]:
    """The recorded value of check ``name``: its verdict and the environments."""
    if isinstance(outcome, CheckResult):
        passed, summary = outcome.passed, outcome.summary
    elif isinstance(outcome, bool):
        passed, summary = outcome, ""
    else:
        raise TypeError(
            f"check {name!r}: its function returned {type(outcome).__name__}, not a verdict; "
            "return True/False or cp.CheckResult(passed=..., summary=...)"
        )
    if len(summary) > SUMMARY_LIMIT:
        summary = "…" + summary[-(SUMMARY_LIMIT - 1) :]
    environments = []
    for start, end in zip(before, after, strict=True):
        entry = dict(end)
        if "error" not in start and "error" not in end:
            entry["changed_during"] = (start["instance"], start["fingerprint"]) != (
                end["instance"],
                end["fingerprint"],
            )
        elif "error" in start and "error" not in end:
            entry = {**start}  # unobservable before it ran: no evidence of what it saw
        environments.append(entry)
    return {"passed": passed, "summary": summary, "environments": environments}


def _observe_all(tools: list[Tool]) -> list[dict[str, Any]]:
    seen = []
    for tool in tools:
        try:
            now = tool.observe()
            if inspect.isawaitable(now):
                _close(now)
                raise TypeError("its observe is async def: check from an async workflow")
        except Exception as exc:  # evidence too: that environment is not verified
            seen.append({"tool": tool.name, "error": error_record(exc)})
        else:
            seen.append(_observation(tool, now))
    return seen


async def _observe_all_async(tools: list[Tool]) -> list[dict[str, Any]]:
    seen = []
    for tool in tools:
        try:
            if inspect.iscoroutinefunction(tool.observe):
                now = await tool.observe()
            else:  # a plain observe does I/O: off the loop
                now = await asyncio.to_thread(tool.observe)
        except Exception as exc:
            seen.append({"tool": tool.name, "error": error_record(exc)})
        else:
            seen.append(_observation(tool, now))
    return seen


def _observation(tool: Tool, now: Any) -> dict[str, Any]:
    if not isinstance(now, Observation):
        message = f"observe returned {type(now).__name__}, not a cp.Observation"
        return {"tool": tool.name, "error": {"type": "TypeError", "message": message}}
    return {
        "tool": tool.name,
        "instance": now.instance,
        "fingerprint": now.fingerprint,
        "version": now.version,
    }


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


def _observes(tool: Tool) -> bool:
    return getattr(type(tool), "observe", None) is not Tool.observe
