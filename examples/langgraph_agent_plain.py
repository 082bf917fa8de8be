"""The agent of ``langgraph_agent.py`` without crashproof: LangGraph's prebuilt
``create_react_agent`` on ``ChatOpenAI`` with the SDK's retries on 408/409/429/5xx
raised to 5, the tools of ``openai_agent_plain.py`` as LangChain tools (their schemas
derived from their signatures, the descriptions the plain twin's), and ``ToolNode``'s
own handling of a tool's error, an unknown tool and arguments that do not validate (a
``ToolMessage`` with the error for the model). No checkpointer: a crash loses the
thread."""

from __future__ import annotations

import warnings

from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import ToolNode, create_react_agent

from .openai_agent import MODEL, SYSTEM
from .openai_agent_plain import TOOLS, Tools

warnings.filterwarnings("ignore", message=".*create_react_agent.*")  # moved, not gone


def agent(base_url: str, tools: Tools, task: str) -> int:
    model = ChatOpenAI(model=MODEL, base_url=base_url, api_key="local", max_retries=5)
    functions = [  # LangChain derives each schema from the method's signature
        StructuredTool.from_function(getattr(tools, f["name"]), description=f["description"])
        for f in (t["function"] for t in TOOLS)
    ]
    node = ToolNode(functions, handle_tool_errors=True)  # an error: the model reads it
    coder = create_react_agent(model, node, prompt=SYSTEM)
    return len(coder.invoke({"messages": [("user", task)]})["messages"])
