"""pydantic-ai's tool approvals as crashproof's signed approvals (``approvals="crashproof"``,
the default of ``CrashproofDurability``).

pydantic-ai defers a call that needs a human: a tool declared ``requires_approval=True``
(``ToolDefinition.kind == "unapproved"``: never executed before it is approved), or one
that raises ``ApprovalRequired``. Left alone, the agent run ends with
``DeferredToolRequests`` and the caller answers with ``DeferredToolResults``: an answer
nobody signed, which the workflow's code (or its input) has to carry.

Here the capability's ``handle_deferred_tool_calls`` hands every such call back to
pydantic-ai as approved *to the gate*, and ``wrap_tool_execute`` performs the approved
call as an act of the tool ``pydantic_ai.approval`` (``APPROVAL_TOOL``; or of the
``cp.Tool`` given for it in ``tools=``) under the run's ``cp.Policy``. The policy says
the act needs an approval (``risk={APPROVAL_TOOL: "high"}, approval_required={"high"}``),
so the run stops in ``awaiting_approval`` on the call's own step key before its intent;
``crashproof approve RUN KEY`` journals a signed approval bound to exactly that call
(its arguments, through the intent digest), and the next drive consumes it and runs the
tool once. An act with no lookup: a crash between its effect and its receipt freezes the
run for review instead of running it again.

Safe by construction, not by configuration: the act's ``prepare`` refuses (``cp.
PermanentError``, nothing executed, the refusal recorded) when it carries no consumed
approval (``Call.approval`` is None) -- a run without a policy, or with one that does
not ask an approval for it, fails with the reason instead of running the tool
unapproved. A reviewer's signed ``replan`` of the act (after a crash between its intent
and its receipt) releases it again under its new operation id, as for any act.
crashproof has no signed denial: an operator who will not approve cancels
the run (``crashproof cancel``).
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

from pydantic_ai.capabilities.abstract import WrapToolExecuteHandler
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved

import crashproof as cp
from crashproof.integrations.pydantic_ai._effects import AsyncFunctionEffect, FunctionEffect

__all__ = ["APPROVAL_TOOL", "approval_tool", "to_the_gate"]

#: The tool name of an approval-requiring function tool's act: give it a risk the run's
#: policy approves, ``cp.Policy(..., allow={APPROVAL_TOOL: "1"}, risk={APPROVAL_TOOL:
#: "high"}, approval_required={"high"})``.
APPROVAL_TOOL = "pydantic_ai.approval"


class _RequiresApproval:
    """Mixed in before a ``cp.Tool``: its act never starts without a signed approval
    consumed for it (``prepare`` runs before the intent; a refusal there executes
    nothing)."""

    __slots__ = ()
    name: ClassVar[str]

    def prepare(self, call: cp.Call) -> dict[str, Any] | None:
        # A reviewer's signed replan (after a crash in the act's window) runs it again
        # under a new epoch, ``run/step@2``: that signed decision is its release.
        replanned = call.operation_id != f"{call.run_id}/{call.step}"
        if call.approval is None and not replanned:
            raise cp.PermanentError(
                f"the pydantic-ai tool call {call.step!r} requires approval, but the run's "
                f"policy asked none for tool {self.name!r}: it was not executed. Give the "
                f"run a cp.Policy with risk={{{self.name!r}: 'high'}} and "
                "approval_required={'high'} (and allow it), or "
                "CrashproofDurability(approvals='pydantic_ai') for pydantic-ai's own loop"
            )
        prepared: dict[str, Any] | None = super().prepare(call)  # type: ignore[misc]
        return prepared


class ApprovalEffect(_RequiresApproval, FunctionEffect):
    """An approval-requiring function tool (sync shell): its body runs once, approved."""

    name: ClassVar[str] = APPROVAL_TOOL


class AsyncApprovalEffect(_RequiresApproval, AsyncFunctionEffect):
    """An approval-requiring function tool (async shell)."""

    name: ClassVar[str] = APPROVAL_TOOL


_GATED: dict[type[cp.Tool], type[cp.Tool]] = {}


def _gated(tool: cp.Tool) -> cp.Tool:
    """``tool`` (a ``cp.Tool`` given in ``tools=``) with the same name, version, lookup
    and state, whose act never starts without a consumed approval."""
    base = type(tool)
    cls = _GATED.get(base)
    if cls is None:
        cls = type(f"Approved{base.__name__}", (_RequiresApproval, base), {})
        _GATED[base] = cls
    twin: Any = object.__new__(cls)
    twin.__dict__.update(getattr(tool, "__dict__", {}))
    for klass in base.__mro__:  # and the attributes a slotted tool keeps in its slots
        for slot in getattr(klass, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(tool, slot):
                setattr(twin, slot, getattr(tool, slot))
    return cast(cp.Tool, twin)


def approval_tool(
    ctx: cp.Context | cp.AsyncContext,
    tool_name: str,
    handler: WrapToolExecuteHandler,
    given: cp.Tool | None,
) -> cp.Tool:
    """The tool that performs an approved call as an act gated by a signed approval."""
    if given is not None:
        return _gated(given)
    if isinstance(ctx, cp.AsyncContext):
        return AsyncApprovalEffect(tool_name, handler)
    return ApprovalEffect(tool_name, handler)


def to_the_gate(requests: DeferredToolRequests) -> DeferredToolResults | None:
    """Every call waiting for approval passed on to be executed as a gated act (the
    signed approval is asked there); external calls (``CallDeferred``) stay deferred."""
    if not requests.approvals:
        return None
    return DeferredToolResults(
        approvals={call.tool_call_id: ToolApproved() for call in requests.approvals}
    )
