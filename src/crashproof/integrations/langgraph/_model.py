"""``durable_model``: a LangChain chat model whose every call inside a LangGraph node is
a ``NodeCalls`` decision, so it is never asked again once recorded.

The wrapper is itself a ``BaseChatModel``: ``create_react_agent`` binds the tools to it
(``bind_tools`` asks the wrapped model to convert them, and keeps what it would send),
and a hand-written node calls ``model.invoke(messages)`` as before. No message is
converted by hand: the decision's arguments are the messages in LangChain's own dict
form (``message_to_dict``), the stop words and the bound options (tools, tool choice);
its value is the answer's ``AIMessage`` in the same form, revived on the first run and
on replay alike. The call's id inside the node is a digest of those arguments, so the
node LangGraph runs again after a crash, sending the same messages, finds the answer.

Streaming (``graph.stream(..., stream_mode="messages")``): a live call is made with the
node's callbacks, so the wrapped model streams its tokens to LangGraph as it would
unwrapped; a recorded call is not made again, and LangGraph emits its answer as one
whole message.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    BaseCallbackManager,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable

import crashproof as cp
from crashproof.integrations.langgraph._calls import NodeCalls

__all__ = ["DurableChatModel", "durable_model"]


def _node_config() -> dict[str, Any]:
    from langgraph.config import get_config

    try:
        return dict(get_config())
    except RuntimeError:
        raise ValueError(
            "a durable model is called inside a LangGraph node (it needs the node's "
            "thread and task); it was called outside a graph, so nothing was sent"
        ) from None


class DurableChatModel(BaseChatModel):
    """``inner`` with each call a decision in ``calls``' ledger (``durable_model``)."""

    inner: BaseChatModel
    calls: Any  # NodeCalls (not a pydantic type)

    @property
    def _llm_type(self) -> str:
        return f"crashproof:{self.inner._llm_type}"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, Any]:
        bound = self.inner.bind_tools(tools, **kwargs)
        return self.bind(**dict(getattr(bound, "kwargs", {})))

    def _args(self, messages: list[BaseMessage], stop: Any, kwargs: Any) -> dict[str, Any]:
        return {
            "messages": [message_to_dict(m) for m in messages],
            "stop": stop,
            "settings": dict(kwargs),
        }

    def _decision(self, message: BaseMessage) -> cp.Decision:
        usage = getattr(message, "usage_metadata", None) or {}
        name = getattr(self.inner, "model_name", None) or getattr(self.inner, "model", None)
        return cp.Decision(
            message_to_dict(message),
            model=str(name or self.inner._llm_type),
            usage={k: int(usage[k]) for k in ("input_tokens", "output_tokens", "total_tokens")
                   if isinstance(usage.get(k), int)},
        )  # fmt: skip

    def _result(self, value: Any) -> ChatResult:
        (message,) = messages_from_dict([value])
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        config = _node_config()
        args = self._args(messages, stop, kwargs)
        callbacks = _children(run_manager, CallbackManager)

        def ask(**_: Any) -> cp.Decision:
            answer = self.inner.invoke(messages, {"callbacks": callbacks}, stop=stop, **kwargs)
            return self._decision(answer)

        ask.__qualname__ = "model"
        return self._result(self.calls.decide(config, _call_id(args), ask, **args))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        config = _node_config()
        args = self._args(messages, stop, kwargs)
        callbacks = _children(run_manager, AsyncCallbackManager)
        loop = asyncio.get_running_loop()

        def ask(**_: Any) -> cp.Decision:
            # On the graph's loop, waiting here in the worker thread the ledger runs in.
            coro = self.inner.ainvoke(messages, {"callbacks": callbacks}, stop=stop, **kwargs)
            return self._decision(asyncio.run_coroutine_threadsafe(coro, loop).result())

        ask.__qualname__ = "model"
        value = await asyncio.to_thread(self.calls.decide, config, _call_id(args), ask, **args)
        return self._result(value)


def _children(run_manager: Any, kind: type[BaseCallbackManager]) -> Any:
    """The callbacks the wrapped model's call inherits (LangGraph's stream handler among
    them, so its tokens reach ``stream_mode="messages"``), as a child of this call."""
    if run_manager is None:
        return None
    manager = kind(handlers=[], parent_run_id=run_manager.run_id)
    manager.set_handlers(run_manager.inheritable_handlers)
    manager.add_tags(run_manager.inheritable_tags)
    manager.add_metadata(run_manager.inheritable_metadata)
    return manager


def _call_id(args: dict[str, Any]) -> str:
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), default=repr)
    return "model:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def durable_model(calls: NodeCalls, model: BaseChatModel) -> DurableChatModel:
    """``model`` with each call inside a LangGraph node recorded once in ``calls``'
    ledger and never asked again: pass it to ``create_react_agent`` or call it in a node
    (``model.bind_tools(tools).invoke(messages)``)."""
    if not isinstance(model, BaseChatModel):
        raise TypeError(f"durable_model takes a LangChain chat model, not {type(model).__name__}")
    return DurableChatModel(inner=model, calls=calls)
