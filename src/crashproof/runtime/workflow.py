"""Workflows: a function ``(ctx, **input) -> result`` with a name and a version.

An ``async def`` workflow is detected and driven by ``Ledger.run_async`` /
``resume_async`` (its ctx is an ``AsyncContext``); a plain one by ``run`` / ``resume``.
The name and version are what a run records: a sync and an async function registered
under the same name and version are the same workflow to the journal."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from crashproof.errors import AsyncMisuse, CrashproofError

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

    def bind_input(self, kwargs: dict[str, Any]) -> None:
        """Raise TypeError now, before a run exists, if ``kwargs`` do not fit the function."""
        try:
            inspect.signature(self.fn).bind(None, **kwargs)
        except TypeError as exc:
            raise TypeError(f"workflow {self.name!r}: {exc}; nothing was started") from None


def make_workflow(
    name: str, version: str, fn: Callable[..., R], compatible_with: Sequence[str] = ()
) -> Workflow[R]:
    if not name or not isinstance(name, str):
        raise ValueError("a workflow needs a non-empty name")
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
    )


def workflow(
    name: str, version: str = "1", *, compatible_with: Sequence[str] = ()
) -> Callable[[Callable[..., R]], Workflow[R]]:
    """Decorator that makes a Workflow without binding it to a ledger (the CLI binds it).
    ``compatible_with``: older versions whose in-flight runs this code can finish."""

    def wrap(fn: Callable[..., R]) -> Workflow[R]:
        return make_workflow(name, version, fn, compatible_with)

    return wrap
