"""The demo's 8-step patch task on crashproof, as a verifier ``Scenario``.

Steps s0..s7: each first asks a (stub) model which hunk comes next (``ctx.decide``), then
appends it — ``+line-0`` .. ``+line-7`` — to ``patch.txt`` through a ``cp.Workspace``
(``ctx.act``), so the artifact is a real file and its fingerprint is
``Workspace.fingerprint()``. The stub model logs every call to a file, so the verifier can
count, across crashes and processes, how often each decision was asked; the file's own
lines say how often each step's effect landed.

``crashproof verify crashproof.verify.patch_scenario:PATCH_TASK`` verifies it;
``examples/patch_task.py`` is the same task written as a user would.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashproof.runtime.context import Context
from crashproof.runtime.options import Decision
from crashproof.runtime.workflow import Workflow, workflow
from crashproof.tools.workspace import Workspace
from crashproof.verify.scenario import Scenario

__all__ = ["PATCH_FILE", "PATCH_TASK", "RUN_ID", "STEPS", "ModelStub", "PatchEnv"]

STEPS = 8
RUN_ID = "demo:patch-8"
PATCH_FILE = "patch.txt"


class ModelStub:
    """A deterministic stand-in for a model endpoint; every call is appended to a file
    (one decision key a line), so the count survives any crash."""

    def __init__(self, calls_file: Path) -> None:
        self.calls_file = calls_file

    def ask(self, key: str, k: int) -> Decision:
        with self.calls_file.open("a", encoding="utf-8") as f:
            f.write(f"{key}\n")
        return Decision(
            f"+line-{k}",
            model="stub-model",
            usage={"input_tokens": 120 + k, "output_tokens": 8},
            cost=0.0002,
        )

    def calls(self) -> dict[str, int]:
        if not self.calls_file.exists():
            return {}
        return dict(Counter(self.calls_file.read_text(encoding="utf-8").split()))


@dataclass(frozen=True, slots=True)
class PatchEnv:
    workspace: Workspace
    model: ModelStub


def make_env(directory: Path) -> PatchEnv:
    """A fresh (or, after a crash, the same) workspace and model log in ``directory``."""
    root = directory / "workspace"
    root.mkdir(exist_ok=True)
    return PatchEnv(Workspace(root), ModelStub(directory / "model.calls"))


def make_workflow(env: PatchEnv) -> Workflow[dict[str, Any]]:
    @workflow("patch-task", version="1")
    def patch_task(ctx: Context, steps: int = STEPS) -> dict[str, Any]:
        for k in range(steps):
            hunk = ctx.decide(f"s{k}:plan", env.model.ask, f"s{k}:plan", k)
            ctx.act(f"s{k}", env.workspace, op="append", path=PATCH_FILE, text=f"{hunk}\n")
        return {"fingerprint": env.workspace.fingerprint()}

    return patch_task


def effects(env: PatchEnv) -> dict[str, int]:
    """How many times each step's line landed in the file: its effect count."""
    path = env.workspace.root / PATCH_FILE
    lines = Counter(path.read_text(encoding="utf-8").splitlines() if path.exists() else [])
    return {f"{RUN_ID}/s{k}": lines[f"+line-{k}"] for k in range(STEPS) if lines[f"+line-{k}"]}


PATCH_TASK: Scenario[PatchEnv] = Scenario(
    name="patch-task",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=lambda env: env.workspace.fingerprint(),
    inputs={"steps": STEPS},
    run_id=RUN_ID,
    effects=effects,
    model_calls=lambda env: env.model.calls(),
)
