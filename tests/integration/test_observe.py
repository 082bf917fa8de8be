"""Environment observation on resume, with real directories, real git and the real local
forge: a run killed mid-way resumes normally in an unchanged world, and pauses in
needs_review — both observations as evidence, nothing executed — when a file was edited
by hand, the git HEAD moved, or the forge's repository was replaced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.journal.records import EventType

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the examples are imported from the repository root
    sys.path.insert(0, str(ROOT))

from examples._forge import Forge  # noqa: E402
from examples.code_agent import effects, make_env, make_workflow  # noqa: E402
from examples.code_agent import fingerprint as world_fingerprint  # noqa: E402


def _ledger(tmp_path: Path, points: cp.CrashPoints | None = None) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path / 'runs.db'}", crash_points=points)


class Counter:
    """A local step that counts its executions in a file outside every environment."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, name: str) -> str:
        with self.path.open("a") as f:
            f.write(name + "\n")
        return name

    def calls(self) -> list[str]:
        return self.path.read_text().split() if self.path.exists() else []


def _edit_flow(ws: cp.Workspace, counter: Counter) -> cp.Workflow[list[Any]]:
    @cp.workflow("edit", version="1")
    def edit(ctx: cp.Context) -> list[Any]:
        out = [ctx.act("a", ws, op="write", path="a.txt", content="one\n")]
        out.append(ctx.step("between", counter, "between"))
        out.append(ctx.act("b", ws, op="append", path="b.txt", text="two\n"))
        out.append(ctx.step("after", counter, "after"))
        return out

    return edit


@pytest.fixture
def ws(tmp_path: Path) -> cp.Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "keep.txt").write_text("base\n")
    return cp.Workspace(root)


def _crash_after(tmp_path: Path, flow: cp.Workflow[Any], point: str, **input: Any) -> None:
    with pytest.raises(cp.SimulatedCrash):
        _ledger(tmp_path, cp.CrashPoints(match=point)).run(flow, run_id="r", **input)


def test_intent_and_receipt_record_observations(tmp_path: Path, ws: cp.Workspace) -> None:
    counter = Counter(tmp_path / "calls")
    before = ws.observe()
    _ledger(tmp_path).run(_edit_flow(ws, counter), run_id="r")
    events = _ledger(tmp_path)._store.load_events("r")
    intent = next(e for e in events if e.type is EventType.ACT_INTENT and e.key == "a")
    done = next(e for e in events if e.type is EventType.STEP_DONE and e.key == "a")
    assert intent.payload["observed"]["before"] == before.to_json()
    # The tool predicted the tree the write left, and the receipt recorded exactly that.
    assert intent.payload["observed"]["expected"] == done.payload["observed"]["fingerprint"]
    assert done.payload["observed"]["fingerprint"] != before.fingerprint
    assert done.payload["observed"]["instance"] == f"workspace:{ws.root}"


@pytest.mark.parametrize(
    "point",
    [
        "after_commit[step_done:between]",  # between two acts
        "after_commit[act_intent:b]",  # an act in flight, not yet executed
        "inside[act:b:renamed]",  # an act done, its receipt lost
    ],
)
def test_unchanged_workspace_resumes_normally(tmp_path: Path, ws: cp.Workspace, point: str) -> None:
    counter = Counter(tmp_path / "calls")
    flow = _edit_flow(ws, counter)
    _crash_after(tmp_path, flow, point)
    result = _ledger_with(tmp_path, flow).resume("r")
    assert [r if isinstance(r, str) else r["path"] for r in result] == [
        "a.txt",
        "between",
        "b.txt",
        "after",
    ]
    assert (ws.root / "b.txt").read_text() == "two\n"  # appended once
    assert counter.calls() == ["between", "after"]
    assert _ledger(tmp_path).get_run("r").status is cp.RunStatus.SUCCEEDED


@pytest.mark.parametrize("point", ["after_commit[step_done:between]", "inside[act:b:renamed]"])
def test_file_edited_by_hand_pauses_in_review(tmp_path: Path, ws: cp.Workspace, point: str) -> None:
    counter = Counter(tmp_path / "calls")
    flow = _edit_flow(ws, counter)
    _crash_after(tmp_path, flow, point)
    calls_before = counter.calls()
    (ws.root / "keep.txt").write_text("edited by hand\n")
    with pytest.raises(cp.RunFrozen) as caught:
        _ledger_with(tmp_path, flow).resume("r")
    assert isinstance(caught.value.cause, cp.EnvironmentChanged)
    info = _ledger(tmp_path).get_run("r")
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    (change,) = info.evidence["environments"]  # type: ignore[index]
    assert change["change"] == "state"
    assert change["recorded"]["instance"] == change["observed"]["instance"]
    assert change["observed"]["fingerprint"] == ws.observe().fingerprint
    assert change["recorded"]["fingerprint"] != change["observed"]["fingerprint"]
    # Nothing executed: no step ran again, b.txt is as the crash left it.
    assert counter.calls() == calls_before
    b_after_crash = "two\n" if "renamed" in point else None
    assert ((ws.root / "b.txt").read_text() if (ws.root / "b.txt").exists() else None) == (
        b_after_crash
    )
    # Still frozen on the next resume, still nothing executed...
    with pytest.raises(cp.RunFrozen):
        _ledger_with(tmp_path, flow).resume("r")
    assert counter.calls() == calls_before
    # ...until someone restores the environment: then the resume goes on.
    (ws.root / "keep.txt").write_text("base\n")
    result = _ledger_with(tmp_path, flow).resume("r")
    assert result[-1] == "after"
    assert (ws.root / "b.txt").read_text() == "two\n"
    assert counter.calls() == [*calls_before, "after"]


def test_workspace_moved_is_another_instance(tmp_path: Path, ws: cp.Workspace) -> None:
    counter = Counter(tmp_path / "calls")
    _crash_after(tmp_path, _edit_flow(ws, counter), "after_commit[step_done:between]")
    moved = tmp_path / "elsewhere"
    ws.root.rename(moved)
    with pytest.raises(cp.RunFrozen):
        _ledger_with(tmp_path, _edit_flow(cp.Workspace(moved), counter)).resume("r")
    info = _ledger(tmp_path).get_run("r")
    (change,) = info.evidence["environments"]  # type: ignore[index]
    assert change["change"] == "instance"
    assert change["recorded"]["instance"] == f"workspace:{ws.root}"
    assert change["observed"]["instance"] == f"workspace:{moved}"
    assert counter.calls() == ["between"]


def _ledger_with(tmp_path: Path, flow: cp.Workflow[Any]) -> cp.Ledger:
    ledger = _ledger(tmp_path)
    ledger.register(flow)
    return ledger


# -- the code agent: workspace + git + forge ---------------------------------------


def _agent(tmp_path: Path, point: str | None) -> None:
    env = make_env(tmp_path)
    try:
        ledger = _ledger(tmp_path, None if point is None else cp.CrashPoints(match=point))
        with pytest.raises(cp.SimulatedCrash):
            ledger.run(make_workflow(env), run_id="agent", task="t")
    finally:
        env.close()


def _resume_agent(tmp_path: Path) -> tuple[Any, Any]:
    env = make_env(tmp_path)
    try:
        ledger = _ledger(tmp_path)
        ledger.register(make_workflow(env))
        try:
            outcome: Any = ledger.resume("agent")
        except cp.RunFrozen as exc:
            outcome = exc
        return outcome, (world_fingerprint(env), effects(env), env.model.calls())
    finally:
        env.close()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=h", "-c", "user.email=h@localhost", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


AGENT_POINT = "after_commit[step_done:branch]"  # commit and branch done, PR not opened


def test_agent_unchanged_world_completes_with_same_artifacts(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    straight.mkdir()
    env = make_env(straight)
    try:
        expected = _ledger(straight).run(make_workflow(env), run_id="agent", task="t")
        expected_world = world_fingerprint(env)
    finally:
        env.close()
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    _agent(crashed, AGENT_POINT)
    outcome, (world, counts, model_calls) = _resume_agent(crashed)
    assert outcome == expected
    assert world == expected_world  # same files, same git trees, same forge records
    assert all(n == 1 for n in counts.values()), counts
    assert model_calls == {"plan": 1, "commit-message": 1}


def _frozen_agent(tmp_path: Path) -> dict[str, Any]:
    outcome, (_world, counts, _calls) = _resume_agent(tmp_path)
    assert isinstance(outcome, cp.RunFrozen), outcome
    assert isinstance(outcome.cause, cp.EnvironmentChanged)
    assert not any(key.endswith("notify") for key in counts)  # nothing executed
    (change,) = _ledger(tmp_path).get_run("agent").evidence["environments"]  # type: ignore[index]
    return change  # type: ignore[no-any-return]


def test_agent_git_head_moved_pauses(tmp_path: Path) -> None:
    _agent(tmp_path, AGENT_POINT)
    repo = tmp_path / "repo"
    _git(repo, "commit", "-q", "--allow-empty", "-m", "someone else")
    change = _frozen_agent(tmp_path)
    assert change["tool"] == "git"
    assert change["change"] == "state"
    assert change["observed"]["fingerprint"] == f"refs/heads/main@{_git(repo, 'rev-parse', 'HEAD')}"
    assert (
        change["recorded"]["fingerprint"] == f"refs/heads/main@{_git(repo, 'rev-parse', 'HEAD~1')}"
    )


def test_agent_forge_repository_replaced_pauses(tmp_path: Path) -> None:
    _agent(tmp_path, "after_commit[act_intent:open-pr]")  # the PR act in flight
    state = json.loads((tmp_path / "forge.json").read_text())
    old_id = state["repos"]["greeter"]["id"]
    Forge(tmp_path / "forge.json").replace_repository("greeter")
    change = _frozen_agent(tmp_path)
    assert change["tool"] == "http"
    assert change["change"] == "instance"
    assert change["recorded"]["instance"] == f"http:{old_id}"
    assert change["observed"]["instance"] != f"http:{old_id}"
    forge_state = json.loads((tmp_path / "forge.json").read_text())
    assert forge_state["created"] == {}  # the pull request was never opened


def test_agent_forge_head_moved_pauses(tmp_path: Path) -> None:
    _agent(tmp_path, "after_commit[step_done:open-pr]")
    Forge(tmp_path / "forge.json").set_head("greeter", "f" * 40)
    change = _frozen_agent(tmp_path)
    assert change["tool"] == "http"
    assert change["change"] == "state"
    assert change["observed"]["details"]["document"]["head"] == "f" * 40
    assert list(json.loads((tmp_path / "forge.json").read_text())["created"].values()) == [1]


def _cache_flow(ws: cp.Workspace, counter: Counter) -> cp.Workflow[str]:
    def build() -> str:  # a local step that leaves output behind (no cache git ignores)
        (ws.root / "out").mkdir(exist_ok=True)
        (ws.root / "out" / "m.o").write_bytes(b"object")
        return counter("build")

    @cp.workflow("cache", version="1")
    def cache(ctx: cp.Context) -> str:
        ctx.act("a", ws, op="write", path="m.py", content="x = 1\n")
        ctx.step("build", build)
        ctx.act("b", ws, op="write", path="n.py", content="y = 2\n")
        return "done"

    return cache


def test_observe_ignore_leaves_caches_out(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    counter = Counter(tmp_path / "calls")
    ws = cp.Workspace(root, observe_ignore=["out/*"])
    _crash_after(tmp_path, _cache_flow(ws, counter), "after_commit[step_done:build]")
    assert _ledger_with(tmp_path, _cache_flow(ws, counter)).resume("r") == "done"
    assert (root / "n.py").exists()


def test_a_step_writing_into_the_workspace_is_a_change(tmp_path: Path) -> None:
    """The documented limit: a step's own writes are not observed, so without
    observe_ignore they look like someone else's edit (the safe direction)."""
    root = tmp_path / "ws"
    root.mkdir()
    counter = Counter(tmp_path / "calls")
    ws = cp.Workspace(root)
    _crash_after(tmp_path, _cache_flow(ws, counter), "after_commit[step_done:build]")
    with pytest.raises(cp.RunFrozen):
        _ledger_with(tmp_path, _cache_flow(ws, counter)).resume("r")
    assert not (root / "n.py").exists()


def test_git_repository_replaced_is_another_instance(tmp_path: Path) -> None:
    from crashproof.tools.git import GitTool

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    counter = Counter(tmp_path / "calls")

    def flow_for(tool: GitTool) -> cp.Workflow[str]:
        @cp.workflow("git-flow", version="1")
        def git_flow(ctx: cp.Context) -> str:
            ctx.act("branch", tool, op="branch", name="feature")
            ctx.step("between", counter, "between")
            ctx.act("branch2", tool, op="branch", name="feature2")
            return "done"

        return git_flow

    _crash_after(tmp_path, flow_for(GitTool(repo)), "after_commit[step_done:between]")
    recorded = GitTool(repo).observe()
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)  # someone re-created it
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "another history")
    with pytest.raises(cp.RunFrozen):
        _ledger_with(tmp_path, flow_for(GitTool(repo))).resume("r")
    (change,) = _ledger(tmp_path).get_run("r").evidence["environments"]  # type: ignore[index]
    assert change["change"] == "instance"
    assert change["recorded"]["instance"] == recorded.instance
    assert change["observed"]["instance"] == GitTool(repo).observe().instance
    assert "feature2" not in _git(repo, "branch", "--list")
