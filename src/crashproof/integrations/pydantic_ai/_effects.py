"""A function tool marked as an effect, as a ``cp.Tool`` without lookup.

Its body is the effect: ``execute`` runs it (through pydantic-ai's handler, so argument
validation and the tool hooks still apply). With no way to ask the world whether a call
happened, a crash between the effect and its receipt leaves an intent the runtime cannot
reconcile: it is settled as the tool's ``on_unknown`` says (set per instance from the
tool's metadata): ``review`` stops the run in ``needs_review`` with the intent as
evidence, ``at_least_once`` runs the body again, ``at_most_once`` records it as not
done; never a guess. Give the tool a ``cp.Tool`` with ``lookup`` in
``CrashproofDurability(tools=...)`` to have such a crash reconciled instead.

A tool's ``ModelRetry`` (the model asked for a wrong thing; nothing happened) is the
receipt's result, so replay raises it again without running the body.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from pydantic_ai.capabilities.abstract import WrapToolExecuteHandler
from pydantic_ai.exceptions import ModelRetry

import crashproof as cp
from crashproof.integrations.pydantic_ai._codec import to_json

__all__ = ["FunctionEffect"]

_RETRY = "pydantic_ai.model_retry"


class FunctionEffect(cp.Tool):
    """The sync shell: ``execute`` is called in a worker thread (a sync workflow's ctx
    call) and runs the handler on the loop ``agent.run_sync`` drives."""

    name: ClassVar[str] = "pydantic_ai.function"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(self, tool_name: str, handler: WrapToolExecuteHandler) -> None:
        self.tool_name = tool_name
        self.handler = handler
        self.loop = asyncio.get_running_loop()

    @staticmethod
    def bind(
        ctx: cp.Context | cp.AsyncContext, tool_name: str, handler: WrapToolExecuteHandler
    ) -> cp.Tool:
        """The shell that fits ``ctx``."""
        if isinstance(ctx, cp.AsyncContext):
            return AsyncFunctionEffect(tool_name, handler)
        return FunctionEffect(tool_name, handler)

    @staticmethod
    def unwrap(result: Any) -> Any:
        """An act's result as the tool's output (or its recorded ``ModelRetry``)."""
        if isinstance(result, dict) and _RETRY in result:
            raise ModelRetry(str(result[_RETRY]))
        return result

    async def _run(self, call: cp.Call) -> cp.Receipt:
        try:
            output = to_json(await self.handler(dict(call.params)))
        except ModelRetry as exc:
            output = {_RETRY: exc.message}
        return cp.Receipt(call.operation_id, output, call.intent_digest)

    def execute(self, call: cp.Call) -> cp.Receipt:
        return asyncio.run_coroutine_threadsafe(self._run(call), self.loop).result()


class AsyncFunctionEffect(FunctionEffect):
    """The async shell: awaited in the workflow's own task."""

    async def execute(self, call: cp.Call) -> cp.Receipt:  # type: ignore[override]
        return await self._run(call)
