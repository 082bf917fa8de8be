"""An export is a move: the source refuses the run from then on and the importing ledger
holds its one continuation. A copy writes nothing and is imported frozen until a signed
decision. Real SQLite ledgers, the patch task's real workspace and scripted model."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity import checkpoint
from crashproof.integrity.signing import generate_keypair, load_private_key

KEY = "ab" * 32


@dataclass
class Env:
    """The seed's patch task environment: a real workspace, a model that logs its calls."""

    workspace: cp.Workspace
    log: Path

    def ask(self, key: str, k: int) -> cp.Decision:
        with self.log.open("a") as f:
            f.write(key + "\n")
        return cp.Decision(f"+line-{k}")

    def calls(self) -> dict[str, int]:
        return dict(Counter(self.log.read_text().split())) if self.log.exists() else {}


def make_env(directory: Path) -> Env:
    (directory / "ws").mkdir(parents=True, exist_ok=True)
    return Env(cp.Workspace(directory / "ws"), directory / "model.log")


def make_workflow(env: Env) -> cp.Workflow[dict[str, Any]]:
    @cp.workflow("patch-task", version="1")
    def patch(ctx: cp.Context, steps: int) -> dict[str, Any]:
        for k in range(steps):
            hunk = ctx.decide(f"s{k}:plan", env.ask, f"s{k}:plan", k)
            ctx.act(f"s{k}", env.workspace, op="append", path="patch.txt", text=hunk + "\n")
        return {"fingerprint": env.workspace.fingerprint()}

    return patch


def effects(env: Env) -> dict[str, int]:
    path = env.workspace.root / "patch.txt"
    return dict(Counter(path.read_text().splitlines())) if path.exists() else {}


patch_task = SimpleNamespace(
    RUN_ID="patch", STEPS=8, make_env=make_env, make_workflow=make_workflow, effects=effects
)
RUN = patch_task.RUN_ID


def ledger_at(path: Path, **kw: Any) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{path}", key=KEY, **kw)


def run(ledger: cp.Ledger, env: Env) -> Any:
    return ledger.run(patch_task.make_workflow(env), run_id=RUN, steps=patch_task.STEPS)


def crashed(tmp_path: Path, at: str = "after_commit[step_done:s2]") -> Path:
    """The patch task in a.db, crashed at ``at`` (s0..s2 appended by default)."""
    db = tmp_path / "a.db"
    env = patch_task.make_env(tmp_path / "env")
    points = cp.CrashPoints(match=at)
    with ledger_at(db, crash_points=points) as ledger, pytest.raises(cp.SimulatedCrash):
        run(ledger, env)
    return db


def world(tmp_path: Path) -> tuple[str, dict[str, int], dict[str, int]]:
    """The environment as it is: artifact fingerprint, effects, model calls."""
    env = patch_task.make_env(tmp_path / "env")
    return env.workspace.fingerprint(), patch_task.effects(env), env.calls()


def reference(tmp_path: Path) -> str:
    env = patch_task.make_env(tmp_path / "reference")
    with ledger_at(tmp_path / "reference.db") as ledger:
        run(ledger, env)
    return env.workspace.fingerprint()


def reviewer(tmp_path: Path, ledger: cp.Ledger) -> Any:
    """A registered reviewer's Ed25519 key."""
    generate_keypair(tmp_path / "rita.pem")
    ledger.add_approver("rita", (tmp_path / "rita.pem.pub").read_text(), by="ops")
    return load_private_key(tmp_path / "rita.pem")


def test_a_moved_run_is_refused_by_its_source_and_continues_where_imported(
    tmp_path: Path,
) -> None:
    db = crashed(tmp_path)
    with ledger_at(db) as source:
        document = source.export_run(RUN, by="alice")
        assert document["records"][-1]["type"] == "run_moved"
        before = world(tmp_path)
        env = patch_task.make_env(tmp_path / "env")
        with pytest.raises(cp.RunMoved) as caught:
            run(source, env)
        for attempt in (lambda: source.resume(RUN), lambda: source.resume(RUN, take_over=True)):
            with pytest.raises(cp.RunMoved):
                attempt()
        assert world(tmp_path) == before, "the source executed something after the move"
        info = source.get_run(RUN)
        assert info.status is cp.RunStatus.MOVED
        assert "exported as a move at generation" in (info.reason or "")
        assert source.runs(status="moved")[0].run_id == RUN
        assert len(source.export_run(RUN, copy=True)["records"]) == len(document["records"])
    error = caught.value
    assert (error.run_id, error.by) == (RUN, "alice")
    assert error.generation == len(document["records"])
    assert error.checkpoint == checkpoint.digest(document)
    message = str(error)
    assert f"was exported at generation {error.generation}" in message
    assert "nothing was executed" in message
    assert "resume it where that checkpoint was imported" in message.lower()

    with ledger_at(tmp_path / "b.db") as target:
        assert target.preview_import(document).installs_as == "running"
        target.import_run(document, by="bob")
        result = run(target, patch_task.make_env(tmp_path / "env"))
        assert target.get_run(RUN).status is cp.RunStatus.SUCCEEDED
    fingerprint, effects, calls = world(tmp_path)
    assert result["fingerprint"] == fingerprint == reference(tmp_path)
    assert set(effects.values()) == {1}  # every line once
    assert calls == {f"s{k}:plan": 1 for k in range(patch_task.STEPS)}  # none asked again


def test_a_run_driven_by_a_live_worker_cannot_be_moved(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    env = patch_task.make_env(tmp_path / "env")
    inside, go = threading.Event(), threading.Event()

    @cp.workflow("held", version="1")
    def held(ctx: cp.Context) -> str:
        ctx.step("first", lambda: "ok")
        inside.set()
        go.wait(30)
        return ctx.step("second", lambda: "done")

    with ledger_at(db) as driver, ledger_at(db) as other:
        thread = threading.Thread(target=lambda: driver.run(held, run_id="h"))
        thread.start()
        try:
            assert inside.wait(30)
            with pytest.raises(cp.LeaseHeld):
                other.export_run("h")
            assert other.get_run("h").status is cp.RunStatus.RUNNING  # nothing written
        finally:
            go.set()
            thread.join(30)
        assert driver.get_run("h").status is cp.RunStatus.SUCCEEDED
    del env


def test_a_crash_after_the_move_commit_loses_no_checkpoint(tmp_path: Path) -> None:
    db = crashed(tmp_path)
    points = cp.CrashPoints(match="after_commit[run_moved]")
    with ledger_at(db, crash_points=points) as ledger, pytest.raises(cp.SimulatedCrash):
        ledger.export_run(RUN)  # the move committed; the document never left
    with ledger_at(db) as ledger:
        assert ledger.get_run(RUN).status is cp.RunStatus.MOVED
        document = ledger.export_run(RUN)  # re-exported: no second move record
        again = ledger.export_run(RUN)
        assert checkpoint.serialize(again) == checkpoint.serialize(document)
        assert [r["type"] for r in document["records"]].count("run_moved") == 1
        with pytest.raises(cp.RunMoved):
            run(ledger, patch_task.make_env(tmp_path / "env"))
    with ledger_at(tmp_path / "b.db") as target:
        target.import_run(document, by="bob")
        run(target, patch_task.make_env(tmp_path / "env"))
    assert world(tmp_path)[0] == reference(tmp_path)


def test_a_crash_before_the_move_commit_moves_nothing(tmp_path: Path) -> None:
    db = crashed(tmp_path)
    points = cp.CrashPoints(match="before_commit[run_moved]")
    with ledger_at(db, crash_points=points) as ledger, pytest.raises(cp.SimulatedCrash):
        ledger.export_run(RUN)
    with ledger_at(db) as ledger:
        assert ledger.get_run(RUN).status is cp.RunStatus.RUNNING
        run(ledger, patch_task.make_env(tmp_path / "env"))  # still the source's to finish
    assert world(tmp_path)[0] == reference(tmp_path)


def test_a_copy_writes_nothing_and_is_imported_frozen_until_a_signed_continue(
    tmp_path: Path,
) -> None:
    db = crashed(tmp_path)
    with ledger_at(db) as source:
        before = len(source.export_run(RUN, copy=True)["records"])
        document = source.export_run(RUN, copy=True)
        assert len(document["records"]) == before  # nothing was written
        assert source.get_run(RUN).status is cp.RunStatus.RUNNING
    # The source is lost (never resumed): the copy is all there is.
    target_db = tmp_path / "b.db"
    with ledger_at(target_db) as target:
        plan = target.preview_import(document)
        assert (plan.transfer, plan.installs_as) == ("copy", "needs_review")
        target.import_run(document, by="bob")
        info = target.get_run(RUN)
        assert info.status is cp.RunStatus.NEEDS_REVIEW
        assert "imported from a copy" in (info.reason or "")
        env_before = world(tmp_path)
        with pytest.raises(cp.RunFrozen, match="imported from a copy"):
            run(target, patch_task.make_env(tmp_path / "env"))
        assert world(tmp_path) == env_before, "a frozen copy executed something"
        (case,) = target.review_cases(RUN, state="open")
        assert case.decisions == ["continue", "abort"]
        rita = reviewer(tmp_path, target)
        with pytest.raises(cp.DecisionRefused, match="replan needs a case raised by an act"):
            target.decide(case.case_id, "replan", key=rita)
        target.decide(case.case_id, "continue", key=rita, by="rita")
        assert target.get_run(RUN).status is cp.RunStatus.RUNNING
        result = run(target, patch_task.make_env(tmp_path / "env"))
        humans = target.get_run(RUN).humans
    assert result["fingerprint"] == world(tmp_path)[0] == reference(tmp_path)
    assert [(h["decision"], h["consumed"]) for h in humans] == [("continue", True)]


def test_an_imported_copy_can_be_aborted(tmp_path: Path) -> None:
    with ledger_at(crashed(tmp_path)) as source:
        document = source.export_run(RUN, copy=True)
    with ledger_at(tmp_path / "b.db") as target:
        target.import_run(document, by="bob")
        (case,) = target.review_cases(RUN, state="open")
        target.decide(case.case_id, "abort", key=reviewer(tmp_path, target))
        assert target.get_run(RUN).status is cp.RunStatus.FAILED
        with pytest.raises(cp.RunFailed, match="aborted by rita"):
            run(target, patch_task.make_env(tmp_path / "env"))


def test_continue_is_only_for_an_imported_copy(tmp_path: Path) -> None:
    """A continue is consumed once; a review case of the run's own (a replayed step that
    changed) accepts abort only, never continue."""
    with ledger_at(crashed(tmp_path)) as source:
        document = source.export_run(RUN, copy=True)
    with ledger_at(tmp_path / "b.db") as target:
        target.import_run(document, by="bob")
        (case,) = target.review_cases(RUN, state="open")
        rita = reviewer(tmp_path, target)
        target.decide(case.case_id, "continue", key=rita)
        with pytest.raises(cp.DecisionRefused, match="not open"):
            target.decide(case.case_id, "continue", key=rita)

        @cp.workflow("patch-task", version="1")
        def changed(ctx: cp.Context, steps: int) -> None:
            ctx.step("s0:plan", lambda: "another step than the journal's")

        with pytest.raises(cp.RunFrozen, match="non-determinism"):
            target.run(changed, run_id=RUN, steps=patch_task.STEPS)
        (own,) = target.review_cases(RUN, state="open")
        assert own.decisions == ["abort"]
        with pytest.raises(cp.DecisionRefused, match="accepts abort, not 'continue'"):
            target.decide(own.case_id, "continue", key=rita)


def test_a_move_imported_back_into_its_source_brings_the_run_back(tmp_path: Path) -> None:
    db = crashed(tmp_path)
    with ledger_at(db) as source:
        document = source.export_run(RUN)
        assert source.preview_import(document).action == "return"
        source.import_run(document, by="alice")
        assert source.get_run(RUN).status is cp.RunStatus.RUNNING
        assert source.preview_import(document).action == "nothing"
        run(source, patch_task.make_env(tmp_path / "env"))
    assert world(tmp_path)[0] == reference(tmp_path)


def test_importing_the_same_move_twice_installs_one_arrival(tmp_path: Path) -> None:
    with ledger_at(crashed(tmp_path)) as source:
        document = source.export_run(RUN)
    with ledger_at(tmp_path / "b.db") as target:
        target.import_run(document, by="bob")
        run(target, patch_task.make_env(tmp_path / "env"))  # it went on here
        assert target.preview_import(document).action == "nothing"
        target.import_run(document, by="bob")  # already here: nothing written
        records = target.export_run(RUN, copy=True)["records"]
    assert [r["type"] for r in records].count("run_imported") == 1
    assert records[-1]["type"] == "run_succeeded"


def test_the_timeline_names_who_moved_and_who_imported(tmp_path: Path) -> None:
    from crashproof.runtime.operations.audit import run_timeline

    with ledger_at(crashed(tmp_path)) as source:
        document = source.export_run(RUN, by="alice")
        moved = run_timeline(source, RUN)[-1]
    assert moved["type"] == "run_moved"
    assert moved["operator"]["by"] == "alice"
    assert "moved out of this ledger" in moved["summary"]
    with ledger_at(tmp_path / "b.db") as target:
        target.import_run(document, by="bob")
        arrived = run_timeline(target, RUN)[-1]
    assert arrived["operator"]["by"] == "bob"
    assert f"imported a move, checkpoint {checkpoint.digest(document)}" in arrived["summary"]


def test_a_ledger_that_cannot_export_moves_nothing() -> None:
    with cp.Ledger("memory://") as ledger:

        @cp.workflow("one", version="1")
        def one(ctx: cp.Context) -> int:
            return ctx.step("a", lambda: 1)

        ledger.run(one, run_id="m")
        with pytest.raises(cp.LedgerError, match="not supported"):
            ledger.export_run("m")
        assert ledger.get_run("m").status is cp.RunStatus.SUCCEEDED


def test_a_worker_never_drives_a_run_that_moved_out(tmp_path: Path) -> None:
    import io

    env = patch_task.make_env(tmp_path / "env")
    workflow = patch_task.make_workflow(env)
    with ledger_at(tmp_path / "a.db") as ledger:
        ledger.enqueue(workflow, run_id="queued", steps=2)
        ledger.enqueue(workflow, run_id="stays", steps=1)
        ledger.export_run("queued")
        log = io.StringIO()
        assert cp.Worker(ledger, poll=0.05, until_idle=True, log=log).serve() == 0
        assert ledger.get_run("queued").status is cp.RunStatus.MOVED
        assert ledger.get_run("stays").status is cp.RunStatus.SUCCEEDED
    driven = {json.loads(line).get("run_id") for line in log.getvalue().splitlines()}
    assert "stays" in driven
    assert "queued" not in driven
    assert effects(env) == {"+line-0": 1}  # only the run that stayed ran
