"""A zygote for the pydantic-ai streaming crash test: a named agent on a real
``OpenAIChatModel`` (the local model server), with ``CrashproofDurability`` and a
``note`` tool marked as an effect (``at_least_once``, to a target that dedupes by
text), run in an async workflow as ``agent.run_stream_events`` (each model request
streamed). Fields of a line: ``URL DIR MODEL_URL SPEC``; SPEC ``none`` runs (or
resumes) to the end, ``event:N`` SIGKILLs the child while it consumes the stream's N-th
event. The run's output and the kinds of the events consumed go to DIR/out.json, every
send of the note to DIR/effects, each text once to DIR/delivered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.run import AgentRunResultEvent

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable, effect


def make_agent(directory: Path, model_url: str) -> Agent[None, str]:
    provider = OpenAIProvider(base_url=model_url + "/v1", api_key="k")
    model = OpenAIChatModel("gpt-test", provider=provider)
    agent = Agent(model, name="notes", capabilities=[CrashproofDurability()])

    @agent.tool_plain(metadata=effect(cp.OnUnknown.AT_LEAST_ONCE))
    def note(text: str) -> str:
        """Write a note (an effect without lookup, sent again after an unknown outcome;
        its target dedupes by text)."""
        with (directory / "effects").open("a") as f:
            f.write(text + "\n")
        delivered = directory / "delivered"
        if text not in (delivered.read_text().split() if delivered.exists() else []):
            with delivered.open("a") as f:
                f.write(text + "\n")
        return "noted"

    return agent


def run(url: str, directory: Path, model_url: str, spec: str) -> None:
    kill_at = int(spec[6:]) if spec.startswith("event:") else 0
    agent = make_agent(directory, model_url)
    kinds: list[str] = []

    async def workflow(ctx: cp.AsyncContext, prompt: str) -> str:
        kinds.clear()  # a drive starts the stream over
        with durable(ctx):
            output = ""
            async with agent.run_stream_events(prompt) as events:
                async for event in events:
                    kinds.append(type(event).__name__)
                    if len(kinds) == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    if isinstance(event, AgentRunResultEvent):
                        output = str(event.result.output)
            return output

    with cp.Ledger(url) as ledger:
        wf = ledger.workflow("notes", version="1")(workflow)
        output = asyncio.run(ledger.run_async(wf, run_id="r", prompt="note it"))
    (directory / "out.json").write_text(json.dumps({"output": output, "events": kinds}))


def child(url: str, directory: str, model_url: str, spec: str) -> None:
    try:
        run(url, Path(directory), model_url, spec)
    except BaseException as exc:  # the zygote exits 0 either way: leave the cause
        (Path(directory) / "error.txt").write_text(repr(exc))
        raise


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared zygote
    from zygote import serve

    serve(child)
