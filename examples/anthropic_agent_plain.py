"""The agent of ``anthropic_agent.py`` without crashproof: ``anthropic.Anthropic`` with
the tools, retries and error messages of ``openai_agent_plain.py``, its schemas written
as Anthropic's tool declarations."""

from __future__ import annotations

from typing import Any

import anthropic

from .anthropic_agent import MODEL
from .openai_agent import SYSTEM
from .openai_agent_plain import TOOLS as OPENAI_TOOLS
from .openai_agent_plain import Tools

TOOLS = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in (tool["function"] for tool in OPENAI_TOOLS)
]


def agent(client: anthropic.Anthropic, tools: Tools, task: str) -> int:
    client = client.with_options(max_retries=5)  # 408, 409, 429, 5xx, 529: with backoff
    messages: list[Any] = [{"role": "user", "content": task}]
    while True:
        reply = client.messages.create(
            model=MODEL, max_tokens=1024, system=SYSTEM, messages=messages, tools=TOOLS
        )
        content = [block.model_dump(mode="json", exclude_none=True) for block in reply.content]
        messages.append({"role": "assistant", "content": content})
        calls = [block for block in reply.content if block.type == "tool_use"]
        if not calls:
            return len(messages)
        results = []
        for call in calls:
            output = tools.call(call.name, call.input)
            result = {"type": "tool_result", "tool_use_id": call.id, "content": output}
            results.append({**result, "is_error": True} if output.startswith("error:") else result)
        messages.append({"role": "user", "content": results})
