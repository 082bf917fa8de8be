"""A zygote for the Agents SDK streaming crash test: the agent of
``tests/integrations/openai_agents/test_runner.py`` (the real SDK and ``openai`` client
against the local model server; ``add`` a step, ``note`` an effect sent again after an
unknown outcome to a target that dedupes by text, ``open_pr`` an act on the forge)
run with ``Runner.run_streamed`` in an async workflow. Fields of a line:
``URL DIR MODEL_URL SPEC``; SPEC ``none`` runs (or resumes) to the end, ``event:N``
SIGKILLs the child while it consumes the stream's N-th event. The final output and the
types of the events consumed go to DIR/out.json."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))
from agents import Runner
from tests.integrations.openai_agents import test_runner as oa

import crashproof as cp
from crashproof.integrations.openai_agents import durable


def run(url: str, directory: Path, model_url: str, spec: str) -> None:
    kill_at = int(spec[6:]) if spec.startswith("event:") else 0
    agent = oa.make(directory, model_url, "at_least_once")
    kinds: list[str] = []

    async def workflow(ctx: cp.AsyncContext, prompt: str) -> Any:
        kinds.clear()  # a drive starts the stream over
        with durable(ctx):
            result = Runner.run_streamed(agent, prompt)
            async for event in result.stream_events():
                kinds.append(getattr(event, "data", event).type)
                if len(kinds) == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return result.final_output

    with cp.Ledger(url) as ledger:
        wf = ledger.workflow("helper", version="1")(workflow)
        output = asyncio.run(ledger.run_async(wf, run_id="r", prompt="go"))
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
