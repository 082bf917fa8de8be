"""The agent of ``openai_agent.py`` on LangGraph's prebuilt ``create_react_agent``: the
same tools (``agent_tools``, given to ``durable_tools``, which makes LangChain tools of
them with the schemas ``cp.models.tool`` derives, each call run through ``NodeCalls``
under its tool-call id), model server (through ``ChatOpenAI``, wrapped by
``durable_model``: each call a decision), forge and artifacts. The thread is
checkpointed by ``CrashproofSaver`` in the ledger's database, and ``start_or_resume``
starts it or finishes what a crash stopped. ``langgraph_agent_plain.py`` is the same
agent without crashproof. Needs ``crashproof[langgraph]`` and ``langchain-openai``.

    python -m examples.langgraph_agent
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from crashproof.integrations.langgraph import (
    CrashproofSaver,
    NodeCalls,
    durable_model,
    durable_tools,
    start_or_resume,
)

from .openai_agent import MODEL, SYSTEM, Env, agent_tools
from .openai_agent import make_env as make_openai_env

warnings.filterwarnings("ignore", message=".*create_react_agent.*")  # moved, not gone
THREAD = "example:langgraph-agent"


def make_env(directory: Path) -> Env:
    return make_openai_env(directory)


def make_agent(env: Env, saver: CrashproofSaver) -> Any:
    calls = NodeCalls(saver.ledger)
    model = ChatOpenAI(model=MODEL, base_url=env.model.url, api_key="local")
    tools = durable_tools(calls, agent_tools(env))
    return create_react_agent(durable_model(calls, model), tools, prompt=SYSTEM, checkpointer=saver)


def coder(agent: Any, task: str) -> int:
    config = {"configurable": {"thread_id": THREAD}}
    return len(start_or_resume(agent, {"messages": [("user", task)]}, config)["messages"])


if __name__ == "__main__":  # one run in a fresh directory: python -m examples.langgraph_agent
    import contextlib
    import secrets
    import tempfile

    from .openai_agent import TASK

    with tempfile.TemporaryDirectory() as tmp:
        env = make_env(Path(tmp))
        key = secrets.token_bytes(32)  # a throwaway ledger, a throwaway key
        with contextlib.closing(env), CrashproofSaver(f"sqlite:///{tmp}/runs.db", key=key) as saver:
            print(coder(make_agent(env, saver), TASK), "messages")
            print("model calls:", env.model.calls())
            print("forge:", env.forge.resources())
