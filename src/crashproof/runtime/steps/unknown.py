"""What an unknown outcome means, when no lookup can settle it (``cp.OnUnknown``).

A tool declares it (``Tool.on_unknown``), and every intent of an act records the
declaration its operation id was first sent under (``act_intent``'s ``on_unknown``;
absent means ``review``, which is what every journal written before the field meant).
On resume the *recorded* declaration wins over the code's: it is a promise about an
effect that already left the process, sealed with its intent. New code that says
``at_least_once`` must not resend a message the old code promised never to repeat, nor
may ``at_most_once`` drop silently what the old code wanted a person to judge. A new
declaration governs every act whose first intent it writes (a replan's new epoch too).

``at_most_once`` (and a reviewer's ``keep``) ends the act as a failed step whose failure
class is ``not_done``; the workflow gets ``cp.ActNotDone``, raised again on replay.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from crashproof.errors import ActNotDone, CrashproofError
from crashproof.journal import payloads
from crashproof.journal.codec import error_record
from crashproof.journal.records import Event, EventType, StepKind, StepStatus
from crashproof.runtime.port import RunSession
from crashproof.tools.port import Call, OnUnknown, Tool

__all__ = ["NOT_DONE", "declared", "record_not_done", "recorded_declaration"]

NOT_DONE = "not_done"  # the failure class of an act recorded as not done


def declared(tool: Tool) -> OnUnknown:
    """The tool's declaration, checked (an instance may set a plain string). A bad one is
    the code's bug, not the act's outcome: refused before anything is journaled."""
    try:
        return OnUnknown(tool.on_unknown)
    except ValueError:
        raise CrashproofError(
            f"tool {tool.name!r}: on_unknown={tool.on_unknown!r} is not one of "
            f"{', '.join(m.value for m in OnUnknown)} (cp.OnUnknown); nothing was sent"
        ) from None


def recorded_declaration(intent: Event) -> OnUnknown:
    """The declaration an ``act_intent`` record holds (``review`` when it holds none)."""
    value = payloads.act_intent(intent).get("on_unknown", OnUnknown.REVIEW.value)
    try:
        return OnUnknown(value)
    except ValueError:  # a newer writer's meaning this code does not know: ask a person
        return OnUnknown.REVIEW


def record_not_done(
    session: RunSession,
    call: Call,
    tool: Tool,
    why: str,
    cause: dict[str, Any] | None,
    **decided: Any,
) -> NoReturn:
    """Journal act ``call`` as not done and raise ``cp.ActNotDone`` into the workflow.
    ``why``: who decided (the tool's declaration, a reviewer); ``decided``: what the
    record keeps of that decision (``on_unknown``, ``case_id``...)."""
    failed = ActNotDone(
        f"act {call.step!r} ({tool.name}): its outcome is unknown and {why}; it is "
        "recorded as not done and never sent again (it may have happened once)"
    )
    now = time.time()
    done = payloads.StepDone(
        kind=StepKind.ACT.value,
        digest=call.intent_digest,
        status=StepStatus.FAILED.value,
        failure=NOT_DONE,
        attempt=call.attempt,
        operation_id=call.operation_id,
        intent_digest=call.intent_digest,
        error=error_record(failed),
        started_at=now,
        ended_at=now,
        not_done=dict(decided),
    )
    if cause is not None:
        done["cause"] = cause
    session.append_event(EventType.STEP_DONE, call.step, payloads.as_dict(done))
    raise failed
