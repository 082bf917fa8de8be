"""LangGraph on crashproof (extra ``crashproof[langgraph]``).

- ``CrashproofSaver``: a LangGraph checkpointer on a crashproof ledger's database,
  its rows sealed by the ledger's key, witnessed against rollback and fenced by a lease
  per thread; JSON only (``JsonSerde``): nothing stored can run code when read.
- ``NodeCalls``: tool calls and model calls inside a node as crashproof acts and
  decisions, keyed by thread, checkpoint, task and tool-call id, so a node LangGraph
  runs again after a crash looks its effects up instead of repeating them.

Only ``crashproof``'s public names are used here; ``import crashproof`` never imports
LangGraph.
"""

from crashproof.integrations.langgraph._calls import FunctionTool, NodeCalls, call_run_id
from crashproof.integrations.langgraph._saver import CrashproofSaver
from crashproof.integrations.langgraph._serde import JsonSerde, StoredError

__all__ = [
    "CrashproofSaver",
    "FunctionTool",
    "JsonSerde",
    "NodeCalls",
    "StoredError",
    "call_run_id",
]
