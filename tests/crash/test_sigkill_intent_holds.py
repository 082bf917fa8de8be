"""No new key around an unknown, with a real crash (#28 item 4): a child process is
killed by SIGKILL between an act's effect and its receipt; a new run with the same act
in this process waits (a retryable stop), naming the dead run, and executes nothing.
Once the dead run is resumed (its lookup finds the effect), the new run goes on.
Before, the new run executed the effect a second time under its own operation id."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

CHILD = """
import json, sys
from pathlib import Path

import crashproof as cp

TARGET = Path(sys.argv[2]) if __name__ == "__main__" else None  # the parent sets it


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
def order(ctx, customer):
    return ctx.act("create", Orders(), customer=customer)


if __name__ == "__main__":
    points = cp.CrashPoints(match="before_commit[step_done:create]", action="sigkill")
    cp.Ledger(f"sqlite:///{sys.argv[1]}", crash_points=points).run(
        order, run_id="A", customer="c1"
    )
"""


def _child_module(target: Path) -> dict[str, Any]:
    """The child's code, loaded here too: the parent resumes its workflow."""
    namespace: dict[str, Any] = {"__name__": "orders_child"}
    exec(compile(CHILD, "orders_child", "exec"), namespace)
    namespace["TARGET"] = target
    return namespace


def test_a_new_run_waits_on_the_intent_a_killed_run_left_in_flight(tmp_path: Path) -> None:
    db, target = tmp_path / "l.db", tmp_path / "target.json"
    child = tmp_path / "child.py"
    child.write_text(CHILD, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(child), str(db), str(target)], capture_output=True, timeout=120
    )
    assert done.returncode == -9, done.stderr  # killed between the effect and the receipt
    assert list(json.loads(target.read_text())) == ["A/create"]

    order = _child_module(target)["order"]
    with cp.Ledger(f"sqlite:///{db}") as ledger:
        with pytest.raises(cp.RunStopped, match="run 'A' holds the same intent unresolved"):
            ledger.run(order, run_id="B", customer="c1")
        assert list(json.loads(target.read_text())) == ["A/create"]  # nothing again
        assert ledger.resume("A") == {"n": 1}  # the dead run's lookup finds its effect
        assert ledger.resume("B") == {"n": 2}  # a new operation, now that A's is known
    assert sorted(json.loads(target.read_text())) == ["A/create", "B/create"]
