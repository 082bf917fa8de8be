"""Outbox: effects whose target can neither dedupe execution nor be looked up.

A notification (a chat message, an e-mail, a webhook without idempotency) cannot be
reconciled after a crash: nobody can ask the target whether it arrived. So the act
does not call the target at all. The message is journaled as the step's own result,
in one commit, and delivered *after* that commit, with the operation id as the
dedupe key; the delivery is journaled too. A crash between the commit and the
delivery record means the message is delivered again on resume (or by
``Ledger.dispatch_outbox``) with the same key: at least once, deduplicable by key,
never lost, never sent for a step that did not commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from crashproof.tools.port import Call, Receipt, Tool

__all__ = ["Message", "Outbox"]


@dataclass(frozen=True, slots=True)
class Message:
    """One outbox message as the delivery function receives it."""

    dedupe_key: str  # the act's operation id: stable across re-deliveries
    run_id: str
    step: str
    body: dict[str, Any]


class Outbox(Tool):
    """``ctx.act("notify", outbox, text="build is green")``: journaled now, delivered
    after the commit. ``deliver(message)`` sends it (raise to leave it pending; it is
    retried on resume or by ``ledger.dispatch_outbox``) and may return a receipt id."""

    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False
    deferred: ClassVar[bool] = True

    def __init__(self, name: str, deliver: Callable[[Message], str | None]) -> None:
        self.name = name  # type: ignore[misc]  # an instance's channel name
        self._deliver = deliver

    def execute(self, call: Call) -> Receipt:
        message = Message(call.operation_id, call.run_id, call.step, call.params)
        receipt_id = self._deliver(message)
        return Receipt(receipt_id or call.operation_id, None)
