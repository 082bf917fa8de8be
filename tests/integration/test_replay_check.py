"""`replay_check`: recorded runs against the current code, executing nothing."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.integrity.checkpoint import serialize


class Counter(cp.Tool):
    """A tool that counts every call, so a test can prove replay calls none."""

    name = "counter"
    version = "1"
    calls: ClassVar[list[str]] = []

    def prepare(self, call: cp.Call) -> dict[str, Any] | None:
        self.calls.append("prepare")
        return None

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.calls.append("execute")
        return cp.Receipt(call.operation_id, {"sent": call.params})

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        self.calls.append("lookup")
        return None


class CounterV2(Counter):
    version = "2"
    contract_mappings: ClassVar[Any] = {"1": lambda p: {"text": p["body"]}}


asked: list[str] = []


def model(prompt: str) -> str:
    asked.append(prompt)
    return f"answer to {prompt}"


def flow(tool: cp.Tool, *, arg: str = "a", body_key: str = "body", steps: int = 3) -> Any:
    @cp.workflow("flow", version="1")
    def run(ctx: cp.Context, topic: str) -> list[Any]:
        out = [ctx.step("fetch", lambda t: t.upper(), topic)]
        out.append(ctx.decide("plan", model, f"{topic}-{arg}"))
        out.append(ctx.act("send", tool, **{body_key: out[1]}))
        if steps > 3:
            out.append(ctx.step("extra", lambda: 1))
        out.append(ctx.now().year > 2000)
        return out

    return run


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    with cp.Ledger(f"sqlite:///{path}") as ledger:
        ledger.run(flow(Counter()), run_id="done", topic="x")
        points = cp.CrashPoints(match="after_commit[act_intent:send]")
        crashing = cp.Ledger(f"sqlite:///{path}", crash_points=points)
        with pytest.raises(cp.SimulatedCrash):
            crashing.run(flow(Counter()), run_id="inflight", topic="y")
        crashing.close()
    Counter.calls.clear()
    asked.clear()
    return path


def digest(path: Path) -> list[str]:
    """The ledger file and its witness file; a WAL left by the read-only snapshot, if any,
    must hold no frame (reading a WAL database through SQLite may create an empty one)."""
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    witness = path.with_name(path.name + ".witness")
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in (path, witness)]


def test_an_unchanged_workflow_is_compatible_and_nothing_runs(ledger_file: Path) -> None:
    before = digest(ledger_file)
    verdicts = cp.replay_check([flow(Counter())], ledger_file)
    assert [(v.run_id, v.status) for v in verdicts] == [
        ("done", "compatible"),
        ("inflight", "compatible"),
    ]
    assert verdicts[0].replayed == verdicts[0].recorded_steps == 4
    assert verdicts[1].replayed == 2  # up to its end of journal: the act is in flight
    assert Counter.calls == []
    assert asked == []
    assert digest(ledger_file) == before  # the ledger (and its witness) untouched


def test_a_changed_step_argument_is_flagged_with_both_digests(ledger_file: Path) -> None:
    verdicts = cp.replay_check([flow(Counter(), arg="b")], ledger_file)
    for v in verdicts:
        assert v.status == "non_deterministic"
        assert v.step == 2
        assert v.key == "plan"
        assert v.recorded is not None
        assert v.now is not None
        assert v.recorded.startswith("decide 'plan' args ")
        assert v.recorded != v.now
        assert v.detail.startswith("non-deterministic at step 2 (recorded decide 'plan'")
        assert v.replayed == 1
    assert asked == []
    assert Counter.calls == []


def test_changed_act_params_are_flagged_recorded_and_in_flight(ledger_file: Path) -> None:
    verdicts = {
        v.run_id: v for v in cp.replay_check([flow(Counter(), body_key="text")], ledger_file)
    }
    assert verdicts["done"].status == "non_deterministic"
    assert verdicts["done"].step == 3
    assert "intent" in (verdicts["done"].recorded or "")
    assert verdicts["inflight"].status == "non_deterministic"
    assert verdicts["inflight"].key == "send"
    assert Counter.calls == []


def test_a_tool_contract_change_is_flagged_and_its_mapping_explained(ledger_file: Path) -> None:
    verdicts = cp.replay_check([flow(CounterV2(), body_key="text")], ledger_file)
    assert all(v.status == "non_deterministic" for v in verdicts)
    assert all("contract changed 1 -> 2" in (v.contract or "") for v in verdicts)
    assert all("mapping explains the change" in (v.contract or "") for v in verdicts)
    # The same contract change with params the mapping does not produce: not explained.
    other = cp.replay_check([flow(CounterV2(), body_key="other")], ledger_file)
    assert all("does not explain" in (v.contract or "") for v in other)
    assert Counter.calls == []


def test_a_workflow_that_ends_before_its_recorded_steps_is_flagged(ledger_file: Path) -> None:
    @cp.workflow("flow", version="1")
    def short(ctx: cp.Context, topic: str) -> str:
        return ctx.step("fetch", lambda t: t.upper(), topic)

    verdict = cp.replay_check([short], ledger_file, run_ids=["done"])[0]
    assert verdict.status == "non_deterministic"
    assert verdict.step == 2
    assert "remain" in verdict.detail


def test_an_extra_step_in_the_middle_is_flagged(ledger_file: Path) -> None:
    verdict = cp.replay_check([flow(Counter(), steps=4)], ledger_file, run_ids=["done"])[0]
    assert verdict.status == "non_deterministic"
    assert verdict.step == 4
    assert "step 'extra'" in (verdict.now or "")


def test_versions_the_code_would_refuse_are_reported(ledger_file: Path) -> None:
    @cp.workflow("flow", version="2")
    def v2(ctx: cp.Context, topic: str) -> str:
        return "v2"

    verdicts = cp.replay_check([v2], ledger_file)
    assert [v.status for v in verdicts] == ["refused", "refused"]
    assert "'1'" in verdicts[0].detail
    assert "'2'" in verdicts[0].detail
    assert cp.replay_check([], ledger_file)[0].status == "refused"


def test_replay_from_an_exported_checkpoint(ledger_file: Path, tmp_path: Path) -> None:
    with cp.Ledger(f"sqlite:///{ledger_file}") as ledger:
        document = ledger.export_run("done")
    export = tmp_path / "done.json"
    export.write_bytes(serialize(document))
    assert cp.replay_check([flow(Counter())], export)[0].status == "compatible"
    assert cp.replay_check([flow(Counter(), arg="b")], export)[0].status == "non_deterministic"


def test_a_source_that_is_neither_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    with pytest.raises(cp.CrashproofError, match="neither a SQLite ledger nor a checkpoint"):
        cp.replay_check([], bad)
    with pytest.raises(cp.CrashproofError, match="no such file"):
        cp.replay_check([], tmp_path / "missing.db")


def test_code_that_a_resume_would_stop_on_is_flagged(ledger_file: Path) -> None:
    @cp.workflow("flow", version="1")
    def unjsonable(ctx: cp.Context, topic: str) -> str:
        return ctx.step("fetch", lambda t: t, {topic})  # a set: no canonical digest

    verdict = cp.replay_check([unjsonable], ledger_file, run_ids=["done"])[0]
    assert verdict.status == "non_deterministic"
    assert "SerializationError" in verdict.detail


def test_a_workflow_that_swallows_the_mismatch_is_still_flagged(ledger_file: Path) -> None:
    @cp.workflow("flow", version="1")
    def swallowing(ctx: cp.Context, topic: str) -> str:
        with contextlib.suppress(cp.NonDeterminismError):
            ctx.step("fetch", lambda t: t, "other")
        return "fine"

    verdict = cp.replay_check([swallowing], ledger_file, run_ids=["done"])[0]
    assert verdict.status == "non_deterministic"
    assert verdict.step == 1
