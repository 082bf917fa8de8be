"""Tool and model calls inside LangGraph nodes, as crashproof acts and decisions.

LangGraph runs a node again from its start when the process died inside it: a side
effect the node made before the crash happens again. ``NodeCalls`` puts each call in a
crashproof run of its own whose id is the call's identity in the graph: thread, the
checkpoint the task started from, the task (its namespace holds the task id, which
LangGraph derives from that checkpoint) and the call id (a tool call's id, which the
recorded model message fixes). The node run again makes the same run id, so:

- an act whose receipt was recorded is replayed; one left in flight by the crash is
  looked up (``cp.Tool.lookup``) before anything is sent again; a tool that cannot
  look up is settled as its ``cp.OnUnknown`` says: ``review`` freezes the call's run
  (``cp.RunFrozen``; ``crashproof review decide CASE --redo | --keep | --abort``, then
  invoke the graph again), ``at_least_once`` sends again, ``at_most_once`` raises
  ``cp.ActNotDone`` in the node, on this invocation and every later one;
- a decision (a model call) that was recorded is not asked again.

The same call id with other parameters is refused (``cp.RunConflict``): the id is bound
to its input. A plain function given to ``act`` is a tool without lookup, whose
unknown outcome means ``NodeCalls(on_unknown=...)`` (default ``review``); wrap it as
``FunctionTool(fn, on_unknown=...)`` to say it per function.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import crashproof as cp

__all__ = ["FunctionTool", "NodeCalls", "call_run_id"]

_WORKFLOW = "crashproof.langgraph.call"
_NOT_DONE = "crashproof.not_done"  # the call's result when its act was settled as not done
# The target of the call being run: per context, not per NodeCalls, because ToolNode runs
# a response's tool calls in parallel threads (ledger.run calls the workflow in the
# caller's thread, so the value set just before it is the one the workflow sees).
_TARGET: contextvars.ContextVar[cp.Tool | Callable[..., Any] | None] = contextvars.ContextVar(
    "crashproof_langgraph_target", default=None
)


class FunctionTool(cp.Tool):
    """A plain function as a tool: ``fn(**params)`` is the effect; no lookup, so a call a
    crash left in flight is settled as ``on_unknown`` says (``cp.OnUnknown``): frozen
    for review (the default), sent again, or recorded as not done."""

    name: ClassVar[str] = "langgraph.function"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(
        self, fn: Callable[..., Any], on_unknown: cp.OnUnknown | str = cp.OnUnknown.REVIEW
    ) -> None:
        self.fn = fn
        self.on_unknown = cp.OnUnknown(on_unknown)

    def execute(self, call: cp.Call) -> cp.Receipt:
        return cp.Receipt(call.operation_id, self.fn(**call.params), call.intent_digest)


def call_run_id(config: Mapping[str, Any], call_id: str) -> str:
    """The crashproof run id of call ``call_id`` of the node running under ``config``."""
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    task_ns = conf.get("checkpoint_ns")
    started_from = (conf.get("checkpoint_map") or {}).get("", conf.get("checkpoint_id"))
    if not thread_id or not task_ns:
        raise ValueError(
            "NodeCalls needs the config LangGraph passes to a node (thread_id and the "
            "task's checkpoint_ns): give the node a `config: RunnableConfig` parameter and "
            "pass it on; nothing was called"
        )
    return f"langgraph:{thread_id}:{started_from}:{task_ns}:{call_id}"


class NodeCalls:
    """Acts and decisions for nodes, journaled in ``ledger`` (a saver's ``.ledger``).

    >>> calls = NodeCalls(saver.ledger)  # doctest: +SKIP
    >>> def tools(state, config):  # doctest: +SKIP
    ...     call = state["messages"][-1].tool_calls[0]
    ...     result = calls.act(config, call["id"], forge, body=call["args"])
    """

    def __init__(
        self, ledger: cp.Ledger, *, on_unknown: cp.OnUnknown | str = cp.OnUnknown.REVIEW
    ) -> None:
        """``on_unknown``: what an unknown outcome means for a plain function given to
        ``act`` (it has no lookup)."""
        self.ledger = ledger
        self.on_unknown = cp.OnUnknown(on_unknown)

        def call(ctx: cp.Context, kind: str, target: str, params: dict[str, Any]) -> Any:
            found = _TARGET.get()
            if found is None:  # a run resumed by someone who did not pass its target
                raise cp.PermanentError(f"no tool or function named {target!r} was given")
            if _target_name(found) != target:  # never another call's: the run stays as it is
                raise cp.CrashproofError(
                    f"call run for {target!r} was given {_target_name(found)!r}; nothing was run"
                )
            if not isinstance(found, cp.Tool):
                return ctx.decide("call", found, **params)
            try:
                return ctx.act("call", found, **params)
            except cp.ActNotDone as exc:  # the run succeeds; the node gets it raised
                return {_NOT_DONE: str(exc)}

        self._workflow = ledger.workflow(_WORKFLOW, version="1")(call)

    def act(
        self,
        config: Mapping[str, Any],
        call_id: str,
        tool: cp.Tool | Callable[..., Any],
        **params: Any,
    ) -> Any:
        """Run ``tool`` with ``params`` once for this call of this node; the receipt's
        result (recorded, then replayed). Raises ``cp.ActNotDone`` when an unknown
        outcome was settled as not done (``at_most_once``, a reviewer's keep)."""
        target = tool if isinstance(tool, cp.Tool) else FunctionTool(tool, self.on_unknown)
        result = self._run(config, call_id, "act", _target_name(target), target, params)
        if isinstance(result, dict) and list(result) == [_NOT_DONE]:
            raise cp.ActNotDone(str(result[_NOT_DONE]))
        return result

    def decide(
        self, config: Mapping[str, Any], call_id: str, fn: Callable[..., Any], **params: Any
    ) -> Any:
        """Ask ``fn(**params)`` (a model call; it may return a ``cp.Decision``) once for
        this call of this node; its answer is recorded and never asked again."""
        return self._run(config, call_id, "decide", _name(fn), fn, params)

    def _run(
        self,
        config: Mapping[str, Any],
        call_id: str,
        kind: str,
        name: str,
        target: cp.Tool | Callable[..., Any],
        params: Any,
    ) -> Any:
        run_id = call_run_id(config, call_id)
        token = _TARGET.set(target)
        try:
            return self.ledger.run(
                self._workflow, run_id=run_id, kind=kind, target=name, params=dict(params)
            )
        finally:
            _TARGET.reset(token)


def _target_name(target: cp.Tool | Callable[..., Any]) -> str:
    # A function is named by itself, wrapped or not (the name is the run's input).
    if isinstance(target, FunctionTool):
        return _name(target.fn)
    return target.name if isinstance(target, cp.Tool) else _name(target)


def _name(fn: Callable[..., Any]) -> str:
    # The qualified name without the module: a script's functions live in "__main__"
    # when run directly, and the run's input (which binds its id) must not change.
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", type(fn).__name__))
