"""The 8-step patch scenario of the demo, on crashproof.

Each step asks a (stub) model which hunk to apply, then applies it to the patch log
as a recorded step. The stub model counts every call in a file, so a test or the demo
can prove no recorded decision was asked again — across processes killed by SIGKILL.

Run as a child process: ``python -m crashproof.verify.patch_scenario DB CALLS SPEC``
where SPEC is ``none``, ``at:N`` (SIGKILL at the N-th crash point), or
``inside:KEY`` (SIGKILL inside the body of step KEY, after its work, before its commit).
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import crashproof as cp

__all__ = ["RUN_ID", "STEPS", "ModelStub", "artifact_fingerprint", "build", "run_child"]

STEPS = 8
RUN_ID = "demo:patch-8"


class ModelStub:
    """A deterministic stand-in for a model endpoint. Every model call and every step
    body execution is logged to a file (one key a line), so counts survive SIGKILL."""

    def __init__(self, calls_file: Path, kill_inside: str | None = None) -> None:
        self.calls_file = calls_file
        self.kill_inside = kill_inside

    def log(self, key: str) -> None:
        with self.calls_file.open("a", encoding="utf-8") as f:
            f.write(f"{key}\n")

    def ask(self, k: int) -> cp.Decision:
        self.log(f"s{k}:plan")
        if self.kill_inside == f"s{k}:plan":  # the model answered; the answer is not recorded
            os.kill(os.getpid(), signal.SIGKILL)
        return cp.Decision(
            f"+line-{k}",
            model="stub-model",
            usage={"input_tokens": 120 + k, "output_tokens": 8},
            cost=0.0002,
        )

    def calls(self) -> list[str]:
        """Keys of model calls, one per call."""
        return [k for k in self._lines() if k.endswith(":plan")]

    def bodies(self) -> list[str]:
        """Keys of step bodies executed, one per execution."""
        return [k for k in self._lines() if k.endswith(":apply")]

    def _lines(self) -> list[str]:
        if not self.calls_file.exists():
            return []
        return self.calls_file.read_text(encoding="utf-8").split()


def build(ledger: cp.Ledger, model: ModelStub, kill_inside: str | None = None) -> cp.Workflow[Any]:
    """Register the scenario's workflow on ``ledger``."""

    def apply(log: list[str], hunk: str, key: str) -> list[str]:
        model.log(key)
        new = [*log, hunk]
        if kill_inside == key:  # the patch is applied in memory; the step is not recorded
            os.kill(os.getpid(), signal.SIGKILL)
        return new

    @ledger.workflow("patch-8", version="1")
    def patch8(ctx: cp.Context, steps: int = STEPS) -> dict[str, Any]:
        log: list[str] = []
        for k in range(steps):
            hunk = ctx.decide(f"s{k}:plan", model.ask, k)
            log = ctx.step(f"s{k}:apply", apply, log, hunk, f"s{k}:apply")
        return {"log": log, "fingerprint": artifact_fingerprint(log)}

    return patch8


def artifact_fingerprint(log: list[str]) -> str:
    """SHA-256 of the patch log, all 64 hex digits."""
    return hashlib.sha256("\n".join(log).encode()).hexdigest()


def run_child(db: Path, calls: Path, spec: str) -> None:
    """Run the scenario in this process, dying as ``spec`` says."""
    points = None
    kill_inside = None
    if spec.startswith("at:"):
        points = cp.CrashPoints(at=int(spec[3:]), action="sigkill")
    elif spec.startswith("inside:"):
        kill_inside = spec[len("inside:") :]
    elif spec != "none":
        raise SystemExit(f"bad spec {spec!r}")
    ledger = cp.Ledger(f"sqlite:///{db.resolve()}", crash_points=points)
    model = ModelStub(calls, kill_inside)
    wf = build(ledger, model, kill_inside)
    ledger.run(wf, run_id=RUN_ID, steps=STEPS)
    ledger.close()


if __name__ == "__main__":
    run_child(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
