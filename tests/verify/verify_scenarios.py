"""Small scenarios for the verifier's tests: one correct, three that misbehave on purpose.

- ``TINY``: a decision and two workspace appends; every crash point ends SAME.
- ``LEAKY``: a tool that appends its effect to a file, keeps no record, cannot look up,
  and still claims ``idempotent_execute``: a crash between its effect and its receipt makes
  recovery execute it again, a duplicate the verifier must call DIVERGED.
- ``STEP_WITH_EFFECT``: a local ``ctx.step`` that writes to the outside world: its effect
  has no intent in the journal, which the history check catches even without a crash.
- ``NO_LOOKUP``: an honest tool that can neither look up nor repeat safely: a crash after
  its intent stops the run in ``needs_review`` — REFUSED, with a reason, never DIVERGED.
- ``SLOW_LEAKY``: ``LEAKY``, whose effect lands long before its answer (as a slow target
  answers): a wall-clock kill (chaos mode) falls between the two in most trials.
- ``VERIFIED``: a code agent whose success needs its own test run at the tree it leaves
  (``ctx.check`` + ``cp.Completion``): it edits, tests, edits once more and tests again;
  every crash point (between the last edit and the last test too) ends SAME, with the
  same completion evidence.
- ``LOOKUP_ONLY``: a tool that finds its effect by operation id when asked (so every
  single crash recovers SAME) but whose execute never checks it: a recoverer that took
  the run over and one that was fenced out while about to execute both write it — only
  the two-recoverers take-over case shows the duplicate.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import crashproof as cp
from crashproof.verify import Scenario


@dataclass
class FileEnv:
    root: Path

    @property
    def effects_file(self) -> Path:
        return self.root / "effects.log"

    def lines(self) -> list[str]:
        path = self.effects_file
        return path.read_text().splitlines() if path.exists() else []

    def calls(self) -> dict[str, int]:
        log = self.root / "model.log"
        return dict(Counter(log.read_text().split())) if log.exists() else {}

    def ask(self, key: str) -> str:
        with (self.root / "model.log").open("a") as f:
            f.write(key + "\n")
        return f"answer to {key}"


def make_env(directory: Path) -> FileEnv:
    (directory / "ws").mkdir(exist_ok=True)
    return FileEnv(directory)


def effect_counts(env: FileEnv) -> dict[str, int]:
    return dict(Counter(env.lines()))


def file_fingerprint(env: FileEnv) -> str:
    workspace = cp.Workspace(env.root / "ws").fingerprint()
    return hashlib.sha256("\n".join([workspace, *sorted(env.lines())]).encode()).hexdigest()


class Leaky(cp.Tool):
    """Writes the effect, keeps no record, no lookup, and claims idempotent execution."""

    name: ClassVar[str] = "leaky"
    supports_lookup: ClassVar[bool] = False
    idempotent_execute: ClassVar[bool] = True  # a lie: executing twice writes twice

    def __init__(self, env: FileEnv) -> None:
        self.env = env

    def execute(self, call: cp.Call) -> cp.Receipt:
        with self.env.effects_file.open("a") as f:
            f.write(call.operation_id + "\n")
        return cp.Receipt(call.operation_id, None, call.intent_digest)


class SlowLeaky(Leaky):
    """The effect first, then a long wait for the answer: the window chaos kills fall in."""

    name: ClassVar[str] = "slow-leaky"

    def execute(self, call: cp.Call) -> cp.Receipt:
        receipt = super().execute(call)
        time.sleep(0.4)
        return receipt


class NoLookup(Leaky):
    """The same tool, honest about it: not idempotent, so never re-executed blindly."""

    name: ClassVar[str] = "no-lookup"
    idempotent_execute: ClassVar[bool] = False


class LookupOnly(cp.Tool):
    """Looks its effect up by operation id, but executes without checking (no dedupe)."""

    name: ClassVar[str] = "lookup-only"
    supports_lookup: ClassVar[bool] = True
    idempotent_execute: ClassVar[bool] = False

    def __init__(self, env: FileEnv) -> None:
        self.env = env

    def execute(self, call: cp.Call) -> cp.Receipt:
        with self.env.effects_file.open("a") as f:
            f.write(call.operation_id + "\n")
        return cp.Receipt(receipt_id=call.operation_id)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if call.operation_id in self.env.lines():
            return cp.Receipt(receipt_id=call.operation_id)
        return None


def lookup_only(env: FileEnv) -> cp.Workflow[Any]:
    tool = LookupOnly(env)

    @cp.workflow("lookup-only", version="1")
    def flow(ctx: cp.Context) -> int:
        ctx.act("first", tool, n=1)
        ctx.act("send", tool, n=2)
        return 2

    return flow


def tiny(env: FileEnv) -> cp.Workflow[Any]:
    ws = cp.Workspace(env.root / "ws")

    @cp.workflow("tiny", version="1")
    def flow(ctx: cp.Context) -> str:
        answer = ctx.decide("ask", env.ask, "ask")
        ctx.act("a", ws, op="append", path="out.txt", text=answer + "\n")
        ctx.act("b", ws, op="append", path="out.txt", text="done\n")
        return str(answer)

    return flow


def leaky(env: FileEnv) -> cp.Workflow[Any]:
    tool = Leaky(env)

    @cp.workflow("leaky", version="1")
    def flow(ctx: cp.Context) -> int:
        for k in range(3):
            ctx.act(f"send-{k}", tool, n=k)
        return 3

    return flow


def slow_leaky(env: FileEnv) -> cp.Workflow[Any]:
    tool = SlowLeaky(env)

    @cp.workflow("slow-leaky", version="1")
    def flow(ctx: cp.Context) -> int:
        for k in range(3):
            ctx.act(f"send-{k}", tool, n=k)
        return 3

    return flow


def no_lookup(env: FileEnv) -> cp.Workflow[Any]:
    tool = NoLookup(env)

    @cp.workflow("no-lookup", version="1")
    def flow(ctx: cp.Context) -> int:
        ctx.act("send", tool, n=1)
        return 1

    return flow


def step_with_effect(env: FileEnv) -> cp.Workflow[Any]:
    def notify() -> str:
        with env.effects_file.open("a") as f:
            f.write("verify:step-with-effect/notify\n")
        return "sent"

    @cp.workflow("step-with-effect", version="1")
    def flow(ctx: cp.Context) -> str:
        return str(ctx.step("notify", notify))

    return flow


CALC_TEST = "from calc import add\nassert add(2, 3) == 5, 'add(2, 3) != 5'\n"


def run_calc_tests(root: str) -> cp.CheckResult:
    """The task's own check: its test file in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-B", "-c", CALC_TEST], cwd=root, capture_output=True, text=True
    )
    return cp.CheckResult(passed=done.returncode == 0, summary=done.stderr[-300:])


def verified(env: FileEnv) -> cp.Workflow[Any]:
    ws = cp.Workspace(env.root / "ws")

    tests = functools.partial(run_calc_tests, str(ws.root))  # no path in the arguments

    @cp.workflow("verified", version="1", completion=cp.Completion(require=["tests"]))
    def flow(ctx: cp.Context) -> dict[str, Any]:
        answer = ctx.decide("ask", env.ask, "ask")
        ctx.act("fix", ws, op="write", path="calc.py", content="def add(a, b):\n    return a + b\n")
        first = ctx.check("tests", tests)
        ctx.act("notes", ws, op="write", path="NOTES.md", content=answer + "\n")
        last = ctx.check("tests", tests)
        return {"first": first.passed, "last": last.passed}

    return flow


TINY = Scenario(
    name="tiny",
    workflow_factory=tiny,
    env_factory=make_env,
    fingerprint=file_fingerprint,
    model_calls=FileEnv.calls,
)
VERIFIED = Scenario(
    name="verified",
    workflow_factory=verified,
    env_factory=make_env,
    fingerprint=file_fingerprint,
    model_calls=FileEnv.calls,
)
LEAKY = Scenario(
    name="leaky",
    workflow_factory=leaky,
    env_factory=make_env,
    fingerprint=file_fingerprint,
    effects=effect_counts,
)
SLOW_LEAKY = Scenario(
    name="slow-leaky",
    workflow_factory=slow_leaky,
    env_factory=make_env,
    fingerprint=file_fingerprint,
    effects=effect_counts,
)
NO_LOOKUP = Scenario(
    name="no-lookup",
    workflow_factory=no_lookup,
    env_factory=make_env,
    fingerprint=file_fingerprint,
    effects=effect_counts,
)
STEP_WITH_EFFECT = Scenario(
    name="step-with-effect",
    workflow_factory=step_with_effect,
    env_factory=make_env,
    fingerprint=file_fingerprint,
    effects=effect_counts,
)
LOOKUP_ONLY = Scenario(
    name="lookup-only",
    workflow_factory=lookup_only,
    env_factory=make_env,
    fingerprint=file_fingerprint,
    effects=effect_counts,
)
