"""Outbox: effects whose target can neither dedupe execution nor be looked up.

A notification (a chat message, an e-mail, a webhook without idempotency) cannot be
reconciled after a crash: nobody can ask the target whether it arrived. So the act
does not call the target at all. The message is journaled as the step's own result,
in one commit, and delivered *after* that commit, with the operation id as the
dedupe key; the delivery is journaled too. A crash between the commit and the
delivery record means the message is delivered again on resume (or by
``Ledger.dispatch_outbox``) with the same key: at least once, deduplicable by key,
never lost, never sent for a step that did not commit.

``deliver`` may be a coroutine function (an async HTTP client's post): the outbox is
then an async tool, delivered on the run's event loop by ``await ledger.run_async`` /
``resume_async``, and on a private loop by ``Ledger.dispatch_outbox`` and workers. A sync
drive refuses it before anything is recorded (``cp.AsyncMisuse``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["AsyncOutbox", "Message", "Outbox"]


@dataclass(frozen=True, slots=True)
class Message:
    """One outbox message as the delivery function receives it."""

    dedupe_key: str  # the act's operation id: stable across re-deliveries
    run_id: str
    step: str
    body: dict[str, Any]


# Sends one message; may return a receipt id. Sync, or a coroutine function.
Deliver: TypeAlias = Callable[[Message], str | None] | Callable[[Message], Awaitable[str | None]]


class Outbox(Tool):
    """``ctx.act("notify", outbox, text="build is green")``: journaled now, delivered
    after the commit. ``deliver(message)`` sends it (raise to leave it pending; it is
    retried on resume or by ``ledger.dispatch_outbox``) and may return a receipt id."""

    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False
    deferred: ClassVar[bool] = True

    def __new__(cls, name: str, deliver: Deliver) -> Outbox:
        # A tool is sync or async per class (the drive asks the class): an async
        # ``deliver`` makes an AsyncOutbox.
        if cls is Outbox and _is_coroutine_function(deliver):
            return super().__new__(AsyncOutbox)
        return super().__new__(cls)

    def __init__(self, name: str, deliver: Deliver) -> None:
        self.name = name  # type: ignore[misc]  # an instance's channel name
        self._deliver = deliver

    def execute(self, call: Call) -> Receipt:
        receipt_id = self._deliver(_message(call))
        return Receipt(receipt_id or call.operation_id, None)  # type: ignore[arg-type]


class AsyncOutbox(Outbox):
    """An outbox whose ``deliver`` is a coroutine function (made by ``cp.Outbox``)."""

    async def execute(self, call: Call) -> Receipt:  # type: ignore[override]
        receipt_id = await self._deliver(_message(call))  # type: ignore[misc]
        return Receipt(receipt_id or call.operation_id, None)


def _message(call: Call) -> Message:
    return Message(call.operation_id, call.run_id, call.step, call.params)


def _is_coroutine_function(fn: Any) -> bool:
    """A coroutine function, behind a decorator that kept ``__wrapped__`` too, or an
    object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn)):
        return True
    call = type(fn).__dict__.get("__call__")
    return call is not None and inspect.iscoroutinefunction(call)
