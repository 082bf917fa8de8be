"""The agent of ``openai_agent_async.py`` without crashproof: ``openai.AsyncOpenAI``
with the tools, schemas, retries and error messages of ``openai_agent_plain.py`` (the
tools run in a worker thread, as the crashproof agent's acts do)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from .openai_agent import MODEL, SYSTEM
from .openai_agent_plain import TOOLS, Tools


async def agent(client: openai.AsyncOpenAI, tools: Tools, task: str) -> int:
    client = client.with_options(max_retries=5)  # 408, 409, 429, 5xx: with backoff
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    while True:
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(mode="json", exclude_none=True))
        if not message.tool_calls:
            return len(messages)
        for call in message.tool_calls:
            content = await asyncio.to_thread(
                tools.call, call.function.name, call.function.arguments
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
