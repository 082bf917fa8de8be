"""LangGraph on crashproof (extra ``crashproof[langgraph]``).

- ``CrashproofSaver``: a LangGraph checkpointer on a crashproof ledger's database,
  its rows sealed by the ledger's key, witnessed against rollback and fenced by a lease
  per thread; JSON only (``JsonSerde``): nothing stored can run code when read.
- ``NodeCalls``: tool calls and model calls inside a node as crashproof acts and
  decisions, keyed by thread, checkpoint, task and tool-call id, so a node LangGraph
  runs again after a crash looks its effects up instead of repeating them.
- ``durable_tools`` and ``durable_model``: the prebuilt parts (``ToolNode``,
  ``create_react_agent``) with each tool call an act (or a recorded read) and each
  model call a decision, through ``NodeCalls``.
- ``resume`` (and ``aresume``, ``resume_stream``, ``aresume_stream``,
  ``start_or_resume``): finish the run a crash stopped in a thread, whatever its last
  node was (``unfinished`` says whether there is one; ``state.next`` alone does not).

Only ``crashproof``'s public names are used here; ``import crashproof`` never imports
LangGraph. The prebuilt parts (``durable_tools``, ``durable_model``) load LangChain's
tools and chat models on first use of their names: a graph built by hand does not pay
for them.
"""

from typing import TYPE_CHECKING

from crashproof.integrations.langgraph._calls import FunctionTool, NodeCalls, call_run_id
from crashproof.integrations.langgraph._resume import (
    aresume,
    aresume_stream,
    resume,
    resume_stream,
    start_or_resume,
    unfinished,
)
from crashproof.integrations.langgraph._saver import CrashproofSaver
from crashproof.integrations.langgraph._serde import JsonSerde, StoredError

if TYPE_CHECKING:
    from crashproof.integrations.langgraph._model import DurableChatModel, durable_model
    from crashproof.integrations.langgraph._tools import durable_tools

_LAZY = {
    "DurableChatModel": "crashproof.integrations.langgraph._model",
    "durable_model": "crashproof.integrations.langgraph._model",
    "durable_tools": "crashproof.integrations.langgraph._tools",
}

__all__ = [
    "CrashproofSaver",
    "DurableChatModel",
    "FunctionTool",
    "JsonSerde",
    "NodeCalls",
    "StoredError",
    "aresume",
    "aresume_stream",
    "call_run_id",
    "durable_model",
    "durable_tools",
    "resume",
    "resume_stream",
    "start_or_resume",
    "unfinished",
]


def __getattr__(name: str) -> object:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
