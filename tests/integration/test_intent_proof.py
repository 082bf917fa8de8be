"""A found receipt must prove the intent (001: a key reused with another intent must
conflict; a lookup that cannot tell is no match).

Before: a receipt that ``lookup`` returned without an intent digest passed as "same
intent", so a run whose operation id another caller had already used ended ``succeeded``
with that caller's resource. Now the act freezes in ``needs_review`` with the receipt as
evidence, unless the tool declares that its target matches key *and* intent.

Against the real HTTP server on loopback: ``IdempotentServer`` keeps intent fingerprints
(HttpTool sends ``Crashproof-Intent-Digest`` and reads it back); its variant
``keeps_fingerprints=False`` dedupes by key only, like the README's old example.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.runtime.port import ActSettings
from crashproof.tools.http import HttpTool

from .http_child import make_tool, make_workflow
from .http_server import IdempotentServer

pytestmark = pytest.mark.timeout(30)

RUN = "run"
K1 = f"{RUN}/create"
FAST = ActSettings(retryable_attempts=3, lookup_attempts=4, backoff=0.01)
IN_FLIGHT = "after_commit[act_intent:create]"  # the intent committed, nothing sent yet


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[IdempotentServer]:
    srv = IdempotentServer(tmp_path / "plain.json", keeps_fingerprints=False).start()
    yield srv
    srv.stop()


def _ledger(tmp_path: Path, **kwargs: Any) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path}/l.db", act_settings=FAST, **kwargs)


def _crash_in_flight_then_resume(tmp_path: Path, tool: HttpTool) -> cp.Ledger:
    """Leave ``create`` in flight (intent journaled, nothing sent), then resume it in a
    new Ledger: the act is reconciled by lookup before anything is sent again."""
    crashing = _ledger(tmp_path, crash_points=cp.CrashPoints(match=IN_FLIGHT))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
    crashing.close()
    return _ledger(tmp_path)


def test_a_foreign_resource_found_without_an_intent_is_not_adopted(
    tmp_path: Path, plain_server: IdempotentServer
) -> None:
    foreign = plain_server.seed(K1, "unused", {"name": "someone else"})
    with make_tool(plain_server.url) as tool:
        ledger = _crash_in_flight_then_resume(tmp_path, tool)
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])

    assert frozen.value.status == "needs_review"
    assert isinstance(frozen.value.cause, cp.ReceiptConflict)
    assert "cannot show which intent" in str(frozen.value)
    evidence = frozen.value.evidence or {}
    assert evidence["receipt"]["receipt_id"] == foreign["id"]
    assert evidence["receipt"]["intent_digest"] is None
    assert evidence["operation_id"] == K1
    info = ledger.get_run(RUN)
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert [r["id"] for r in plain_server.resources()] == [foreign["id"]]  # nothing created
    assert plain_server.count(K1, "POST") == 0
    ledger.close()


def test_even_our_own_effect_is_frozen_when_the_target_cannot_show_its_intent(
    tmp_path: Path, plain_server: IdempotentServer
) -> None:
    # The POST committed, the reply was lost: the lookup finds it, but a target that
    # keeps no fingerprint cannot tell it from a foreign one. Fail closed.
    plain_server.arm(drop_after_commit=1, key=K1)
    with make_tool(plain_server.url) as tool:
        ledger = _ledger(tmp_path)
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
    assert isinstance(frozen.value.cause, cp.ReceiptConflict)
    assert len(plain_server.resources()) == 1
    assert plain_server.count(K1, "POST") == 1
    ledger.close()


def test_a_target_that_keeps_fingerprints_proves_our_own_effect(
    tmp_path: Path, server: IdempotentServer
) -> None:
    server.arm(drop_after_commit=1, key=K1)
    with make_tool(server.url) as tool:
        ledger = _ledger(tmp_path)
        result = ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
    assert result["bodies"] == [{"name": "a"}, {"name": "b"}]
    assert server.count(K1, "POST") == 1
    assert len(server.resources()) == 2
    ledger.close()


def test_a_target_that_keeps_fingerprints_names_the_foreign_intent(
    tmp_path: Path, server: IdempotentServer
) -> None:
    server.seed(K1, "0" * 64, {"name": "someone else"})
    with make_tool(server.url) as tool:
        ledger = _crash_in_flight_then_resume(tmp_path, tool)
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
    assert isinstance(frozen.value.cause, cp.ReceiptConflict)
    assert (frozen.value.evidence or {})["receipt"]["intent_digest"] == "0" * 64
    ledger.close()


class Slots(cp.Tool):
    """A state-addressed target: slot ``operation id`` holds exactly the intended value,
    so finding the value is finding this intent (``matches_intent``)."""

    name: ClassVar[str] = "slots"
    version: ClassVar[str] = "1"
    matches_intent: ClassVar[bool] = True

    def __init__(self) -> None:
        self.slots: dict[str, Any] = {}

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.slots[call.operation_id] = call.params["value"]
        raise TimeoutError("the reply was lost")  # unknown outcome: looked up next

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if self.slots.get(call.operation_id) != call.params["value"]:
            return None
        return cp.Receipt(call.operation_id, {"value": call.params["value"]})


def test_a_tool_whose_target_matches_key_and_intent_needs_no_digest() -> None:
    target = Slots()
    with cp.Ledger("memory://", act_settings=FAST) as ledger:

        @ledger.workflow("slots", version="1")
        def fill(ctx: cp.Context) -> Any:
            return ctx.act("put", target, value=7)

        assert ledger.run(fill, run_id="r") == {"value": 7}
        (step,) = ledger.get_run("r").steps
        assert step.status is cp.StepStatus.SUCCEEDED


def test_the_shipped_state_addressed_tools_declare_it() -> None:
    from crashproof.tools.git import GitTool

    assert cp.Workspace.matches_intent is True
    assert GitTool.matches_intent is True
    assert HttpTool.matches_intent is False  # it proves the intent with the digest header
    assert cp.Tool.matches_intent is False


def test_the_same_operation_executed_twice_directly_lands_once(
    tmp_path: Path, server: IdempotentServer
) -> None:
    # Unproven before (#28): the target's dedupe, not the runtime, is what makes a second
    # execute of one operation id harmless. Both shipped deduping tools, called directly.
    call = cp.Call(
        run_id=RUN, step="create", operation_id=K1, intent_digest="ab" * 32, params={"body": {}}
    )
    with make_tool(server.url) as tool:
        first, second = tool.execute(call), tool.execute(call)
    assert first.receipt_id == second.receipt_id
    assert len(server.resources()) == 1
    assert server.count(K1, "POST") == 2

    workspace = cp.Workspace(tmp_path / "ws")
    params = {"op": "append", "path": "notes.txt", "text": "+once\n"}
    ws_call = cp.Call(
        run_id=RUN, step="w", operation_id=f"{RUN}/w", intent_digest="cd" * 32, params=params
    )
    ws_call = cp.Call(
        run_id=RUN,
        step="w",
        operation_id=f"{RUN}/w",
        intent_digest="cd" * 32,
        params=params,
        prepared=workspace.prepare(ws_call),
    )
    assert workspace.execute(ws_call).receipt_id == workspace.execute(ws_call).receipt_id
    assert (tmp_path / "ws" / "notes.txt").read_text() == "+once\n"


def test_a_deduping_targets_answer_without_an_intent_is_not_adopted(
    tmp_path: Path, plain_server: IdempotentServer
) -> None:
    """The issue's probe, on execute: the target already holds the operation id with
    other parameters and answers the POST with that stored resource (it dedupes by key
    only). Before, the run ended ``succeeded`` with the other caller's resource."""
    foreign = plain_server.seed(K1, "unused", {"name": "someone else"})
    with make_tool(plain_server.url) as tool, _ledger(tmp_path) as ledger:
        with pytest.raises(cp.RunFrozen) as frozen:
            ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
        assert ledger.get_run(RUN).status is cp.RunStatus.NEEDS_REVIEW
    assert isinstance(frozen.value.cause, cp.ReceiptConflict)
    assert "answered operation 'run/create' but cannot show which intent" in str(frozen.value)
    assert (frozen.value.evidence or {})["receipt"]["receipt_id"] == foreign["id"]
    assert [r["id"] for r in plain_server.resources()] == [foreign["id"]]  # nothing created


def test_a_target_that_keeps_fingerprints_is_adopted_on_execute(
    tmp_path: Path, server: IdempotentServer
) -> None:
    with make_tool(server.url) as tool, _ledger(tmp_path) as ledger:
        result = ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
    assert result["bodies"] == [{"name": "a"}, {"name": "b"}]
