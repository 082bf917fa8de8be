"""resume --override-intent: a run waiting on an intent another run holds unresolved
(stopped, retryable) exits 6 with a hint naming the worker that resumes it and the way
past; ``runs`` names whom it waits for and how to override; an override names a holding
run (anything else is a usage error, nothing journaled), is journaled with who made it,
and shows in the timeline."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.cli import ExitCode
from crashproof.journal.records import EventType

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

ORDERS = """
import json
import pathlib

import crashproof as cp

TARGET = pathlib.Path("target.json")


class Orders(cp.Tool):
    name = "orders"
    version = "1"

    def _state(self):
        return json.loads(TARGET.read_text()) if TARGET.exists() else {}

    def execute(self, call):
        state = self._state()
        state.setdefault(call.operation_id, call.intent_digest)
        TARGET.write_text(json.dumps(state))
        return cp.Receipt(call.operation_id, {"n": len(state)}, call.intent_digest)

    def lookup(self, call):
        digest = self._state().get(call.operation_id)
        return None if digest is None else cp.Receipt(call.operation_id, {"n": 1}, digest)


@cp.workflow("order", version="1")
def order(ctx, customer: str):
    return ctx.act("create", Orders(), customer=customer)
"""


@pytest.fixture
def held(project: Path) -> Iterator[Any]:
    """Run A crashed between its effect and its receipt; run B waits on A's intent."""
    (project / "orders_app.py").write_text(ORDERS, encoding="utf-8")
    sys.path.insert(0, str(project))  # the project fixture restores sys.path
    module = importlib.import_module("orders_app")
    points = cp.CrashPoints(match="before_commit[step_done:create]")
    with (
        cp.Ledger("sqlite:///crashproof.db", crash_points=points) as ledger,
        pytest.raises(cp.SimulatedCrash),
    ):
        ledger.run(module.order, run_id="A", customer="c1")
    with cp.Ledger("sqlite:///crashproof.db") as ledger, pytest.raises(cp.RunStopped):
        ledger.run(module.order, run_id="B", customer="c1")
    yield module
    sys.modules.pop("orders_app", None)


def test_a_held_intent_waits_until_an_override_names_its_holder(
    held: Any, cli: Cli, project: Path
) -> None:
    waiting = cli("resume", "B", "--app", "orders_app")
    assert waiting.code == ExitCode.RUN_INTERRUPTED
    error, hint = waiting.err.splitlines()
    assert "waiting for another run: run 'A' holds the same intent unresolved" in error
    assert "a worker (`crashproof worker`) resumes this run" in hint
    assert "--override-intent RUN --by NAME" in hint
    [row] = [r for r in cli("runs", "--json").json() if r["run_id"] == "B"]
    assert (row["status"], row["retryable"]) == ("stopped", True)
    assert "run 'A' holds" in row["reason"]
    assert "--override-intent A" in row["reason"]
    assert len(json.loads((project / "target.json").read_text())) == 1  # A's effect only

    wrong = cli("resume", "B", "--app", "orders_app", "--override-intent", "Z", "--by", "eve")
    assert wrong.code == ExitCode.USAGE
    assert "not by Z" in wrong.err
    with cp.Ledger("sqlite:///crashproof.db") as ledger:
        assert not [e for e in ledger.journal("B") if e.type is EventType.INTENT_OVERRIDE]

    passed = cli("resume", "B", "--app", "orders_app", "--override-intent", "A", "--by", "alice")
    assert passed.code == ExitCode.OK, passed.err
    assert len(json.loads((project / "target.json").read_text())) == 2  # B's own effect
    entries = cli("show", "B", "--timeline", "--json").json()["timeline"]
    [entry] = [e for e in entries if e["type"] == "intent_override"]
    assert entry["operator"]["by"] == "alice"
    assert entry["key"] == "create"
