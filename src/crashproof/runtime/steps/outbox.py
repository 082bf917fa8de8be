"""The outbox side of ``ctx.act``: journal the message in the step's own commit, then
deliver it with the operation id as dedupe key, and journal the delivery.

See ``crashproof.tools.outbox`` for why. Delivery failures never fail the run: the
message stays pending (the attempt is journaled as evidence) and is delivered again on
resume or by ``Ledger.dispatch_outbox``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from crashproof.journal import payloads
from crashproof.journal.codec import encode, error_record
from crashproof.journal.records import EventType, StepKind, StepStatus
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.handoff import Invoke, Work
from crashproof.tools.port import Call, Tool

__all__ = ["deliver", "enqueue"]

log = logging.getLogger(__name__)

Append = Callable[[EventType, str, dict[str, Any]], None]


def enqueue(
    session: RunSession, key: str, tool: Tool, params: dict[str, Any], digest: str
) -> Work[Any]:
    """Commit the message as the step's result, then try to deliver it once."""
    operation_id = f"{session.run_id}/{key}"
    result = {"operation_id": operation_id, "outbox": tool.name}
    now = time.time()
    session.append_event(
        EventType.STEP_DONE,
        key,
        payloads.as_dict(
            payloads.StepDone(
                kind=StepKind.ACT.value,
                digest=digest,
                status=StepStatus.SUCCEEDED.value,
                attempt=1,
                operation_id=operation_id,
                intent_digest=digest,
                outbox=payloads.Outbox(tool=tool.name, message=params),
                started_at=now,
                ended_at=now,
            )
        ),
        encode(result, what=f"outbox act {key!r}"),
    )
    yield from deliver(session.append_event, session.run_id, key, tool, params, digest)
    return result


def deliver(
    append: Append, run_id: str, key: str, tool: Tool, params: dict[str, Any], digest: str
) -> Work[bool]:
    """Deliver one journaled message; journal the outcome. True when delivered."""
    call = Call(
        run_id=run_id,
        step=key,
        operation_id=f"{run_id}/{key}",
        intent_digest=digest,
        params=params,
    )
    try:
        receipt = yield Invoke(tool.execute, (call,), f"delivery by tool {tool.name!r}")
    except Exception as exc:  # the target is down: the message stays pending
        log.warning(
            "outbox delivery failed; it stays pending",
            extra={"run_id": run_id, "step": key, "error": str(exc)},
        )
        append(
            EventType.OUTBOX_FAILED,
            key,
            payloads.as_dict(
                payloads.OutboxFailed(
                    operation_id=call.operation_id, error=error_record(exc), at=time.time()
                )
            ),
        )
        return False
    append(
        EventType.OUTBOX_DELIVERED,
        key,
        payloads.as_dict(
            payloads.OutboxDelivered(
                operation_id=call.operation_id,
                receipt_id=getattr(receipt, "receipt_id", None),
                at=time.time(),
            )
        ),
    )
    return True
