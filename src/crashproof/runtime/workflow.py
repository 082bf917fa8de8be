"""Workflows: a function ``(ctx, **input) -> result`` with a name and a version.

An ``async def`` workflow is detected and driven by ``Ledger.run_async`` /
``resume_async`` (its ctx is an ``AsyncContext``); a plain one by ``run`` / ``resume``.
The name and version are what a run records: a sync and an async function registered
under the same name and version are the same workflow to the journal."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from crashproof.errors import AsyncMisuse, CrashproofError, UnknownWorkflow
from crashproof.journal.codec import storable
from crashproof.runtime.guards.completion import Completion
from crashproof.runtime.guards.policy import Policy

__all__ = ["RESERVED_PARAMS", "Workflow", "workflow"]

RESERVED_PARAMS = frozenset({"run_id", "options"})

R = TypeVar("R")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Workflow(Generic[R]):
    """A registered workflow. Calling it directly is not supported: run it through a Ledger."""

    name: str
    version: str
    fn: Callable[..., R]
    # Older versions whose in-flight runs this code can replay (it keeps their branches,
    # e.g. behind ctx.patched): those runs resume here instead of being refused.
    compatible_with: tuple[str, ...] = ()
    # The checks its success needs (runtime/guards/completion.py); None: none.
    completion: Completion | None = None

    @property
    def is_async(self) -> bool:
        """An ``async def`` workflow (driven by ``run_async`` / ``resume_async``)."""
        return inspect.iscoroutinefunction(self.fn)

    def check_shell(self, is_async: bool) -> None:
        """Refuse an async workflow through the sync entry points, or the reverse, before
        anything is started or changed."""
        if self.is_async and not is_async:
            raise AsyncMisuse(
                f"workflow {self.name!r} is async (async def); nothing was started or "
                "changed. Drive it with `await ledger.run_async(...)` / `resume_async(...)`"
            )
        if is_async and not self.is_async:
            raise AsyncMisuse(
                f"workflow {self.name!r} is a plain function; nothing was started or "
                "changed. Drive it with `ledger.run(...)` / `resume(...)` (from async code: "
                "`await asyncio.to_thread(ledger.run, ...)`), or make it `async def`"
            )

    def can_resume(self, version: str) -> bool:
        return version == self.version or version in self.compatible_with

    def check_resumes(self, run_id: str, version: str) -> None:
        """Refuse to drive a run started on a version this code cannot replay."""
        if not self.can_resume(version):
            raise UnknownWorkflow(
                f"run {run_id!r} started on workflow {self.name!r} version {version!r}, but "
                f"this process registers version {self.version!r} (compatible with "
                f"{list(self.compatible_with)}); nothing was changed. Deploy a worker that "
                "still registers the old version to finish it, or declare "
                "compatible_with=[...] if this code replays it."
            )

    def bind_input(self, kwargs: dict[str, Any]) -> None:
        """Raise TypeError now, before a run exists, if ``kwargs`` do not fit the function."""
        try:
            _signature(self.fn).bind(None, **kwargs)
        except TypeError as exc:
            raise TypeError(f"workflow {self.name!r}: {exc}; nothing was started") from None


@functools.lru_cache(maxsize=256)
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """A workflow function's signature (~15 µs to compute, asked at every run start)."""
    return inspect.signature(fn)


def make_workflow(
    name: str,
    version: str,
    fn: Callable[..., R],
    compatible_with: Sequence[str] = (),
    completion: Completion | None = None,
) -> Workflow[R]:
    if not name or not isinstance(name, str):
        raise ValueError("a workflow needs a non-empty name")
    for said, text in (("name", name), ("version", version)):
        if isinstance(text, str) and not storable(text):  # every run's row holds both
            raise ValueError(
                f"workflow {said} {text!r} holds a NUL character or a lone surrogate, "
                "which a ledger cannot store: use UTF-8 text without NUL"
            )
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise CrashproofError(f"workflow {name!r}: the first parameter must be the context (ctx)")
    clash = RESERVED_PARAMS.intersection(p.name for p in params[1:])
    if clash:
        raise CrashproofError(
            f"workflow {name!r}: parameter name(s) {sorted(clash)} are reserved by Ledger.run; "
            "rename them"
        )
    return Workflow(
        name=name,
        version=str(version),
        fn=fn,
        compatible_with=tuple(str(v) for v in compatible_with),
        completion=_completion(name, completion),
    )


def _completion(name: str, completion: Any) -> Completion | None:
    if completion is None or isinstance(completion, Completion):
        return completion
    raise TypeError(
        f"workflow {name!r}: completion= takes cp.Completion(require=[...]), not "
        f"{type(completion).__name__}"
    )


def workflow(
    name: str,
    version: str = "1",
    *,
    compatible_with: Sequence[str] = (),
    completion: Completion | None = None,
) -> Callable[[Callable[..., R]], Workflow[R]]:
    """Decorator that makes a Workflow without binding it to a ledger (the CLI binds it).
    ``compatible_with``: older versions whose in-flight runs this code can finish;
    ``completion``: the checks a success needs (``cp.Completion(require=[...])``)."""

    def wrap(fn: Callable[..., R]) -> Workflow[R]:
        return make_workflow(name, version, fn, compatible_with, completion)

    return wrap


class Registry:
    """The workflows and policies a Ledger can drive, by name and by version (a mixin of
    ``Ledger``, which owns the two dicts)."""

    _workflows: dict[str, Workflow[Any]]
    _policies: dict[str, Policy]

    def workflow(
        self,
        name: str,
        version: str = "1",
        *,
        compatible_with: Sequence[str] = (),
        completion: Completion | None = None,
    ) -> Callable[[Callable[..., R]], Workflow[R]]:
        """Decorator: register ``fn(ctx, **input)`` under ``name`` and ``version``;
        ``compatible_with`` lists older versions whose in-flight runs it can finish;
        ``completion`` the checks its success needs (``cp.Completion``)."""

        def wrap(fn: Callable[..., R]) -> Workflow[R]:
            return self.register(make_workflow(name, version, fn, compatible_with, completion))

        return wrap

    def register(self, wf: Workflow[R]) -> Workflow[R]:
        """Register a workflow made elsewhere (e.g. with ``cp.workflow``)."""
        known = self._workflows.get(wf.name)
        if known is not None and known is not wf and known.version != wf.version:
            raise CrashproofError(
                f"workflow {wf.name!r} is already registered with version {known.version!r}"
            )
        self._workflows[wf.name] = wf
        return wf

    @property
    def workflows(self) -> dict[str, Workflow[Any]]:
        return dict(self._workflows)

    def register_policy(self, policy: Policy) -> Policy:
        """Make ``policy`` available to runs bound to its version (resumes find the policy
        a run recorded here). One content per version: changed rules need a new version."""
        if not isinstance(policy, Policy):
            raise TypeError(f"register_policy expects a cp.Policy, not {type(policy).__name__}")
        known = self._policies.get(policy.version)
        if known is not None and known.digest != policy.digest:
            raise CrashproofError(
                f"policy version {policy.version!r} is already registered with other rules "
                f"(digest {known.digest}, now {policy.digest}); give changed rules a new version"
            )
        self._policies[policy.version] = policy
        return policy

    @property
    def policies(self) -> dict[str, Policy]:
        return dict(self._policies)
