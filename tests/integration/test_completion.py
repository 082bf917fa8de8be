"""Completion evidence: a code agent's success needs its own test run, passing at the tree
it leaves (ctx.check + cp.Completion; runtime/steps/checks.py, runtime/guards/completion.py).

The check here is real: the workspace's own test file run by a Python subprocess."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.integrity import checkpoint
from crashproof.integrity.keys import Keyring

CODE = "def add(a, b):\n    return a - b\n"  # the bug the agent fixes
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, 'add(2, 3) != 5'\nprint('1 passed')\n"


def seed(root: Path) -> cp.Workspace:
    root.mkdir()
    (root / "calc.py").write_text(CODE)
    (root / "test_calc.py").write_text(TEST)
    return cp.Workspace(root)


def run_tests(root: str) -> cp.CheckResult:
    """The task's own check: its test file, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-B", "test_calc.py"], cwd=root, capture_output=True, text=True
    )
    return cp.CheckResult(passed=done.returncode == 0, summary=(done.stdout + done.stderr)[-500:])


REQUIRE = cp.Completion(require=["tests"])


def ledger_at(tmp_path: Path) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")


def test_an_edit_after_the_last_passing_tests_is_refused_completion(tmp_path: Path) -> None:
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)

    @ledger.workflow("fix", completion=REQUIRE)
    def fix(ctx: cp.Context) -> str:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        assert ctx.check("tests", run_tests, str(ws.root)).passed
        ctx.act("docs", ws, op="write", path="NOTES.md", content="fixed add\n")  # one more edit
        return "done"

    with pytest.raises(cp.Unverified) as raised:
        ledger.run(fix, run_id="r1")
    reason = raised.value.reason
    assert reason.startswith("unverified: act 'docs' changed ")
    assert "after the last passing 'tests'" in reason
    info = ledger.get_run("r1")
    assert info.status is cp.RunStatus.STOPPED
    assert info.reason == reason
    # Nothing ran twice and nothing was lost: a resume replays to the same verdict.
    with pytest.raises(cp.Unverified):
        ledger.resume("r1")
    assert (ws.root / "NOTES.md").read_text() == "fixed add\n"


def test_the_same_workflow_with_a_final_test_run_succeeds_with_the_evidence(
    tmp_path: Path,
) -> None:
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)

    @ledger.workflow("fix", completion=REQUIRE)
    def fix(ctx: cp.Context) -> str:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        ctx.check("tests", run_tests, str(ws.root))
        ctx.act("docs", ws, op="write", path="NOTES.md", content="fixed add\n")
        result = ctx.check("tests", run_tests, str(ws.root))
        return result.summary.strip()

    assert ledger.run(fix, run_id="r1") == "1 passed"
    events = ledger.journal("r1")
    outcome = events[-1]
    assert outcome.type.value == "run_succeeded"
    evidence = outcome.payload["completion"]
    assert evidence["require"] == ["tests"]
    (check,) = evidence["checks"]
    assert check["step"] == "tests#2"
    (env,) = check["environments"]
    assert env["tool"] == "workspace"
    assert env["changed_during"] is False
    assert env["fingerprint"] == ws.fingerprint()  # the tree the run leaves


def test_an_unverified_run_completes_once_the_code_checks_again(tmp_path: Path) -> None:
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)

    def body(ctx: cp.Context, final_check: bool) -> str:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        ctx.check("tests", run_tests, str(ws.root))
        ctx.act("docs", ws, op="write", path="NOTES.md", content="fixed add\n")
        if final_check:
            ctx.check("tests", run_tests, str(ws.root))
        return "done"

    first = cp.workflow("fix", completion=REQUIRE)(lambda ctx: body(ctx, False))
    with pytest.raises(cp.Unverified):
        ledger.run(first, run_id="r1")
    ledger2 = ledger_at(tmp_path)
    ledger2.register(cp.workflow("fix", completion=REQUIRE)(lambda ctx: body(ctx, True)))
    assert ledger2.resume("r1") == "done"
    info = ledger2.get_run("r1")
    assert info.status is cp.RunStatus.SUCCEEDED


def test_a_failing_last_check_and_a_missing_check_are_named(tmp_path: Path) -> None:
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)

    @ledger.workflow("unfixed", completion=REQUIRE)
    def unfixed(ctx: cp.Context) -> bool:
        return ctx.check("tests", run_tests, str(ws.root)).passed  # the bug is still there

    with pytest.raises(cp.Unverified) as raised:
        ledger.run(unfixed, run_id="failing")
    assert "the last 'tests' check (tests) failed: AssertionError: add(2, 3) != 5" in str(
        raised.value
    )

    @ledger.workflow("unchecked", completion=REQUIRE)
    def unchecked(ctx: cp.Context) -> str:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        return "trust me"

    with pytest.raises(cp.Unverified, match="no check 'tests' was recorded"):
        ledger.run(unchecked, run_id="unchecked")


def test_a_change_without_an_act_after_the_check_is_seen_at_completion(tmp_path: Path) -> None:
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)

    def scribble(root: str) -> None:  # a step that writes where only acts should
        (Path(root) / "calc.py").write_text(CODE)

    @ledger.workflow("sneaky", completion=REQUIRE)
    def sneaky(ctx: cp.Context) -> str:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        ctx.check("tests", run_tests, str(ws.root))
        ctx.step("scribble", scribble, str(ws.root))
        return "done"

    with pytest.raises(
        cp.Unverified, match="changed after the last passing 'tests', not by an act"
    ):
        ledger.run(sneaky, run_id="r1")


def test_a_check_that_changes_the_tree_it_checks_is_not_evidence(tmp_path: Path) -> None:
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)

    def build_in_place(root: str) -> bool:
        (Path(root) / "build.out").write_text("artifact\n")
        return True

    @ledger.workflow("build", completion=cp.Completion(require=["build"]))
    def build(ctx: cp.Context) -> str:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        ctx.check("build", build_in_place, str(ws.root))
        return "done"

    with pytest.raises(cp.Unverified, match="changed while 'build' ran"):
        ledger.run(build, run_id="r1")


def test_an_async_check_writes_the_sync_journal(tmp_path: Path) -> None:
    journals: list[list[tuple[Any, ...]]] = []
    for shell in ("sync", "async"):
        journals.append(_fix_journal(tmp_path, shell))
    assert journals[0] == journals[1]


def _fix_journal(tmp_path: Path, shell: str) -> list[tuple[Any, ...]]:
    ws = seed(tmp_path / shell)
    ledger = cp.Ledger(f"sqlite:///{tmp_path / (shell + '.db')}")
    tests = functools.partial(run_tests, str(ws.root))  # no path in the arguments
    if shell == "sync":

        @ledger.workflow("fix", completion=REQUIRE)
        def fix(ctx: cp.Context) -> bool:
            ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
            return ctx.check("tests", tests).passed

        assert ledger.run(fix, run_id="r1") is True
    else:

        @ledger.workflow("fix", completion=REQUIRE)
        async def afix(ctx: cp.AsyncContext) -> bool:
            await ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
            return (await ctx.check("tests", tests)).passed

        assert asyncio.run(ledger.run_async(afix, run_id="r1")) is True
    return [
        (e.type, e.key, e.payload.get("kind"), e.payload.get("digest"), e.value_json is None)
        for e in ledger.journal("r1")
    ]


def test_bad_completion_and_check_arguments_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one check name"):
        cp.Completion(require=[])
    with pytest.raises(ValueError, match="not a check name"):
        cp.Completion(require=["tests#2"])
    with pytest.raises(TypeError, match=r"completion= takes cp\.Completion"):
        cp.workflow("x", completion=["tests"])(lambda ctx: None)  # type: ignore[arg-type]
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)

    @ledger.workflow("bad")
    def bad(ctx: cp.Context) -> Any:
        return ctx.check("tests", lambda: "ok")

    with pytest.raises(cp.RunFailed, match=r"return True/False or cp\.CheckResult"):
        ledger.run(bad, run_id="r1")
    del ws


def _verified_checkpoint(tmp_path: Path) -> tuple[dict[str, Any], cp.Ledger]:
    ws = seed(tmp_path / "repo")
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'a.db'}", key="ab" * 32)

    @ledger.workflow("fix", completion=REQUIRE)
    def fix(ctx: cp.Context) -> bool:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        return ctx.check("tests", run_tests, str(ws.root)).passed

    assert ledger.run(fix, run_id="r1") is True
    return ledger.export_run("r1", copy=True), ledger


def test_the_evidence_is_in_the_checkpoint_and_an_edited_one_is_refused(tmp_path: Path) -> None:
    document, source = _verified_checkpoint(tmp_path)
    last = document["records"][-1]
    assert last["type"] == "run_succeeded"
    evidence = json.loads(last["payload"])["completion"]
    assert evidence["checks"][0]["step"] == "tests"
    check = next(r for r in document["records"] if r["key"] == "tests")
    assert json.loads(check["value"])["passed"] is True
    # Claim the check saw another tree: the document's signature and, re-signed by a key
    # holder, the record's own MAC refuse it; nothing is installed.
    fingerprint = evidence["checks"][0]["environments"][0]["fingerprint"]
    for record in (last, check):
        bad = copy.deepcopy(document)
        index = document["records"].index(record)
        field = "payload" if record is last else "value"
        bad["records"][index][field] = record[field].replace(fingerprint, "0" * 64)
        assert bad["records"][index][field] != record[field]
        resigned = checkpoint.sign(bad, Keyring.from_hex("ab" * 32))
        for attempt in (bad, resigned):
            target = cp.Ledger(f"sqlite:///{tmp_path / 'b.db'}", key="ab" * 32)
            with pytest.raises(cp.CheckpointRejected):
                target.import_run(attempt, by="alice")
            assert target.runs() == []
            target.close()
    # Unchanged, it imports, and the evidence reads the same there.
    target = cp.Ledger(f"sqlite:///{tmp_path / 'c.db'}", key="ab" * 32)
    assert target.import_run(document, by="alice") == "r1"
    assert target.get_run("r1").evidence == source.get_run("r1").evidence


def test_a_policy_can_require_the_evidence_for_every_run_bound_to_it(tmp_path: Path) -> None:
    ws = seed(tmp_path / "repo")
    ledger = ledger_at(tmp_path)
    verified = cp.Policy(version="p1", allow={"workspace": "1"}, completion=REQUIRE)
    assert "completion" not in cp.Policy(version="p1", allow={"workspace": "1"}).declaration()

    def body(ctx: cp.Context, check: bool) -> str:
        ctx.act("edit", ws, op="write", path="calc.py", content=FIXED)
        if check:
            ctx.check("tests", run_tests, str(ws.root))
        return "done"

    unchecked = cp.workflow("unchecked")(lambda ctx: body(ctx, False))
    checked = cp.workflow("checked")(lambda ctx: body(ctx, True))
    bound = cp.RunOptions(policy=verified)
    with pytest.raises(cp.Unverified, match="no check 'tests' was recorded"):
        ledger.run(unchecked, run_id="u", options=bound)
    assert ledger.run(unchecked, run_id="free") == "done"  # no policy: nothing required
    assert ledger.run(checked, run_id="c", options=bound) == "done"
    assert ledger.get_run("c").evidence["completion"]["require"] == ["tests"]
    with pytest.raises(TypeError, match="completion= takes"):
        cp.Policy(version="p2", allow={}, completion=["tests"])  # type: ignore[arg-type]
