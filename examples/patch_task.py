"""The seed's 8-step patch task, and the scenario that proves its recovery.

Steps s0..s7: each asks a model which hunk comes next (``ctx.decide``: recorded, never asked
again), then appends it — ``+line-0`` .. ``+line-7`` — to ``patch.txt`` through a
``cp.Workspace`` (``ctx.act``: a state-addressed write that cannot apply twice).

Verify it: ``crashproof verify examples.patch_task:SCENARIO`` (add ``--mode subprocess``
for real SIGKILLs). The scenario tells the verifier how to build a fresh environment (a
workspace and a scripted model that logs its calls to a file), how to fingerprint the
artifacts, and how to count effects and model calls from the targets' own records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.verify import Scenario

RUN_ID = "example:patch-task"
STEPS = 8


class ScriptedModel:
    """A local stand-in for a model: scripted answers, every call logged to a file."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def ask(self, key: str, k: int) -> cp.Decision:
        if self.log.with_name(DOWN).exists():  # out: never answered, so never logged
            raise cp.Unavailable("503 Service Unavailable: the scripted model is down")
        with self.log.open("a", encoding="utf-8") as f:
            f.write(key + "\n")
        return cp.Decision(f"+line-{k}", model="scripted", usage={"total_tokens": 20})

    def calls(self) -> dict[str, int]:
        return dict(Counter(self.log.read_text().split())) if self.log.exists() else {}


DOWN = "model.down"  # while this file exists in the environment, the model is out


def outage(directory: Path, down: bool) -> None:
    """``crashproof verify --mode chaos --faults outage``: the model down (a 503) or back."""
    flag = directory / DOWN
    if down:
        flag.touch()
    else:
        flag.unlink(missing_ok=True)


@dataclass
class Env:
    workspace: cp.Workspace
    model: ScriptedModel


def make_env(directory: Path) -> Env:
    """A fresh environment in an empty directory; after a crash, the one left there."""
    (directory / "ws").mkdir(exist_ok=True)
    return Env(cp.Workspace(directory / "ws"), ScriptedModel(directory / "model.log"))


def make_workflow(env: Env) -> cp.Workflow[dict[str, Any]]:
    @cp.workflow("patch-task", version="1")
    def patch_task(ctx: cp.Context, steps: int) -> dict[str, Any]:
        for k in range(steps):
            hunk = ctx.decide(f"s{k}:plan", env.model.ask, f"s{k}:plan", k)
            ctx.act(f"s{k}", env.workspace, op="append", path="patch.txt", text=hunk + "\n")
        return {"fingerprint": env.workspace.fingerprint()}

    return patch_task


def effects(env: Env) -> dict[str, int]:
    """Each step's line, counted in the file itself: how often its effect landed."""
    path = env.workspace.root / "patch.txt"
    lines = Counter(path.read_text().splitlines()) if path.exists() else Counter()
    return {f"{RUN_ID}/s{k}": lines[f"+line-{k}"] for k in range(STEPS) if lines[f"+line-{k}"]}


SCENARIO = Scenario(
    name="patch-task",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=lambda env: env.workspace.fingerprint(),
    inputs={"steps": STEPS},
    run_id=RUN_ID,
    effects=effects,
    model_calls=lambda env: env.model.calls(),
    outage=outage,
)
