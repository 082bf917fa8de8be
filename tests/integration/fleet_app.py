"""The app module of the fleet test (``crashproof worker --app fleet_app``): an agent that
asks a model, acts on what it answered, thinks a while, and at the end posts a message
through an outbox. Configured by environment variables, read at import:

- ``FLEET_MODEL``: the base URL of an OpenAI-wire model server (tests/models/
  model_server.py). The SDK's own retries are off; crashproof retries a refused
  connection twice (``RETRY``), a budget much shorter than the outages the test makes.
- ``FLEET_EFFECTS``: the file ``Effects`` appends to. Its execute appends one line per
  call and never dedupes, so a duplicated effect shows as a repeated operation id; its
  lookup reads the file.
- ``FLEET_OUTBOX``: the file the outbox delivers to, one line per delivery (a duplicate
  delivery is allowed: the receiver dedupes by key). While ``FLEET_OUTBOX`` + ``.down``
  exists, the receiver is out and a delivery raises (the message stays pending).
- ``FLEET_THINK``: seconds each round's local step takes (default 0.2).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar

import openai

import crashproof as cp

EFFECTS = Path(os.environ.get("FLEET_EFFECTS", "effects.txt"))
OUTBOX = Path(os.environ.get("FLEET_OUTBOX", "outbox.txt"))
THINK = float(os.environ.get("FLEET_THINK", "0.2"))
RETRY = cp.RetryPolicy(attempts=2, backoff=0.2, max_backoff=1.0)

client = openai.OpenAI(
    base_url=os.environ.get("FLEET_MODEL", "http://127.0.0.1:9/v1"),
    api_key="fleet-test",
    timeout=5.0,
)


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class Effects(cp.Tool):
    """One line per execute (``operation_id text``); lookup by operation id."""

    name: ClassVar[str] = "effects"
    version: ClassVar[str] = "1"

    def execute(self, call: cp.Call) -> cp.Receipt:
        _append(EFFECTS, f"{call.operation_id} {call.params['text']}")
        return cp.Receipt(call.operation_id, {"text": call.params["text"]}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if EFFECTS.exists():
            for line in EFFECTS.read_text(encoding="utf-8").splitlines():
                if line.split(" ", 1)[0] == call.operation_id:
                    text = call.params["text"]
                    return cp.Receipt(call.operation_id, {"text": text}, call.intent_digest)
        return None


def deliver(message: cp.Message) -> str:
    if OUTBOX.with_name(OUTBOX.name + ".down").exists():
        raise ConnectionRefusedError("the message receiver is down")
    _append(OUTBOX, f"{message.dedupe_key} {message.body['text']}")
    return message.dedupe_key


effects = Effects()
notices = cp.Outbox("notices", deliver)


@cp.workflow("fleet")
def fleet(ctx: cp.Context, rounds: int) -> int:
    """``rounds`` times: ask the model (a decision), act on its answer, think."""
    llm = cp.models.openai_chat(ctx, client, options=cp.StepOptions(retry=RETRY))
    for i in range(rounds):
        reply = llm.create(
            model="fleet-model", messages=[{"role": "user", "content": f"{ctx.run_id} round {i}"}]
        )
        answer = reply.choices[0].message.content or ""
        ctx.act("effect", effects, text=f"{ctx.run_id}:{i}:{answer}")
        ctx.step("think", time.sleep, THINK)
    ctx.act("notify", notices, text=f"{ctx.run_id} done")
    return rounds
