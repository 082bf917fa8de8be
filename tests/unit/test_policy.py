"""Policies: what a run may do, judged before an act's intent is committed, recorded with
the run, and bound to it — another policy needs an explicit, journaled re-bind."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.guards.policy import Verdict

from ._support import LedgerFactory


class Counting(cp.Tool):
    """A tool that only counts what it was asked to do."""

    name: ClassVar[str] = "counting"
    version: ClassVar[str] = "1"
    idempotent_execute: ClassVar[bool] = True

    def __init__(self) -> None:
        self.executed: list[dict[str, Any]] = []
        self.done: dict[str, cp.Receipt] = {}  # by operation id: what a resume re-reads

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.executed.append(call.params)
        receipt = cp.Receipt(
            f"r{len(self.executed)}", {"n": len(self.executed)}, call.intent_digest
        )
        self.done[call.operation_id] = receipt
        return receipt

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        return self.done.get(call.operation_id)


class Other(Counting):
    name: ClassVar[str] = "other"


class Web(cp.Tool):
    name: ClassVar[str] = "http"
    version: ClassVar[str] = "1"

    def __init__(self, base_url: str, method: str = "POST") -> None:
        self.base_url = base_url
        self.method = method


def policy(version: str = "p1", **kw: Any) -> cp.Policy:
    kw.setdefault("allow", {"counting": "1"})
    return cp.Policy(version, **kw)


# -- evaluation ----------------------------------------------------------------


def test_allowlist_by_name_and_contract_version() -> None:
    p = policy(allow={"counting": ["1", "2"]})
    assert p.evaluate(Counting(), {}).allowed
    refused = p.evaluate(Other(), {})
    assert (refused.allowed, refused.rule) == (False, "allow")
    assert "'other' is not in its allowlist (allowed: counting)" in refused.reason

    class V3(Counting):
        version: ClassVar[str] = "3"

    refused = p.evaluate(V3(), {})
    assert (refused.allowed, refused.rule) == (False, "version")
    assert "version '3' is not allowed (allowed: 1, 2)" in refused.reason
    assert policy(allow={"counting": "*"}).evaluate(V3(), {}).allowed
    assert not cp.Policy("empty", allow={}).evaluate(Counting(), {}).allowed


def test_declarative_scopes_are_fnmatch_globs_on_normalized_paths() -> None:
    p = policy(scopes={"counting": {"path": ["src/*", "README.md"]}})
    ok = ["src/a.py", "src/deep/b.py", "./src/c.py", "src//d.py", "README.md"]
    for path in ok:
        assert p.evaluate(Counting(), {"path": path}).allowed, path
    for path in ["docs/x.md", "src/../secrets.txt", "../src/a.py", "/src/a.py", "readme.md"]:
        verdict = p.evaluate(Counting(), {"path": path})
        assert (verdict.allowed, verdict.rule) == (False, "scope"), path
    assert "has a '..' segment" in p.evaluate(Counting(), {"path": "src/../x"}).reason
    missing = p.evaluate(Counting(), {"text": "no path"})
    assert "has no 'path' to check" in missing.reason
    several = p.evaluate(Counting(), {"path": ["src/a", "etc/passwd"]})
    assert "'etc/passwd' is outside" in several.reason


def test_host_scope_reads_the_tools_base_url_or_a_url_param() -> None:
    p = cp.Policy("p", allow={"http": "1"}, scopes={"http": {"host": "*.github.com"}})
    assert p.evaluate(Web("https://API.GitHub.com/v3"), {}).allowed
    refused = p.evaluate(Web("https://evil.example"), {})
    assert "host 'evil.example' is outside the http scope" in refused.reason
    assert not p.evaluate(Web("https://api.github.com"), {"url": "http://evil.example/x"}).allowed


def test_scope_functions_and_risk_functions() -> None:
    def only_small(tool: cp.Tool, params: Mapping[str, Any]) -> bool:
        return int(params.get("size", 0)) < 10

    def by_method(tool: cp.Tool, params: Mapping[str, Any]) -> str:
        return "high" if getattr(tool, "method", "") == "DELETE" else "low"

    p = cp.Policy(
        "p",
        allow={"counting": "1", "http": "1"},
        scopes={"counting": only_small},
        risk={"http": by_method, "counting": "medium"},
        approval_required={"high"},
    )
    assert p.evaluate(Counting(), {"size": 3}) == Verdict(True, risk="medium")
    assert "the scope check callable:" in p.evaluate(Counting(), {"size": 30}).reason
    delete = p.evaluate(Web("https://x", "DELETE"), {})
    assert (delete.allowed, delete.risk, delete.needs_approval) == (True, "high", True)
    assert not p.evaluate(Web("https://x"), {}).needs_approval


def test_a_broken_policy_function_is_an_error_not_a_refusal() -> None:
    def boom(tool: cp.Tool, params: Mapping[str, Any]) -> bool:
        raise KeyError("size")

    def maybe(tool: cp.Tool, params: Mapping[str, Any]) -> Any:
        return None

    with pytest.raises(cp.CrashproofError, match=r"the scope function .* raised KeyError"):
        policy(scopes={"counting": boom}).evaluate(Counting(), {})
    with pytest.raises(cp.CrashproofError, match="returned None, not True/False"):
        policy(scopes={"counting": maybe}).evaluate(Counting(), {})
    with pytest.raises(cp.CrashproofError, match="risk level must be one of"):
        policy(risk=maybe).evaluate(Counting(), {})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"scopes": {"nope": {"path": "*"}}}, "scopes names tool 'nope'"),
        ({"risk": {"nope": "low"}}, "risk names tool 'nope'"),
        ({"risk": {"counting": "extreme"}}, "not 'extreme'"),
        ({"approval_required": {"critical"}}, "not 'critical'"),
        ({"default_risk": "none"}, "not 'none'"),
    ],
)
def test_policy_configuration_is_checked(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy(**kw)


def test_the_digest_covers_the_declarative_part() -> None:
    base = policy(scopes={"counting": {"path": ["src/*"]}}, identity="bot")
    same = policy(scopes={"counting": {"path": "src/*"}}, identity="bot")
    assert base.digest == same.digest
    assert len(base.digest) == 64
    assert policy(scopes={"counting": {"path": ["lib/*"]}}, identity="bot").digest != base.digest
    assert policy(scopes={"counting": {"path": ["src/*"]}}, identity="ops").digest != base.digest
    assert base.record() == {"version": "p1", "digest": base.digest, "identity": "bot"}


# -- in a ledger ------------------------------------------------------------------


def acting(tool: cp.Tool, *params: dict[str, Any]) -> cp.Workflow[list[Any]]:
    @cp.workflow("acting")
    def flow(ctx: cp.Context) -> list[Any]:
        out: list[Any] = []
        for i, p in enumerate(params):
            try:
                out.append(ctx.act(f"a{i}", tool, **p))
            except cp.PolicyViolation as exc:
                out.append(f"refused: {exc}")
        return out

    return flow


def test_a_refused_act_is_journaled_not_executed_and_replays_identically(
    open_ledger: LedgerFactory,
) -> None:
    tool = Counting()
    flow = acting(tool, {"path": "src/a"}, {"path": "etc/passwd"}, {"path": "src/b"})
    p = policy(scopes={"counting": {"path": "src/*"}}, identity="bot@example.com")
    points = cp.CrashPoints(match="before_commit[run_succeeded]")
    with pytest.raises(cp.SimulatedCrash):
        open_ledger(crash_points=points).run(flow, run_id="r", options=cp.RunOptions(policy=p))
    assert [e["path"] for e in tool.executed] == ["src/a", "src/b"]
    ledger = open_ledger()
    ledger.register(flow)
    ledger.register_policy(p)
    result = ledger.resume("r")
    assert result[1].startswith("refused: act 'a1' refused by policy 'p1': path 'etc/passwd'")
    assert len(tool.executed) == 2  # replayed: nothing executed again

    info = ledger.get_run("r")
    step = info.steps[1]
    assert (step.status, step.failure, step.attempts) == (cp.StepStatus.FAILED, "policy", 0)
    assert step.error is not None
    assert step.error["type"].endswith("PolicyViolation")
    assert info.policy == p.record()
    events = ledger._store.load_events("r")
    refused = [e for e in events if e.key == "a1"]
    assert [e.type for e in refused] == [EventType.STEP_DONE]  # no intent was committed
    assert refused[0].payload["policy"]["rule"] == "scope"
    assert refused[0].value == {"refused": {"params": {"path": "etc/passwd"}}}
    assert events[0].payload["policy"] == {
        "version": "p1", "digest": p.digest, "identity": "bot@example.com",
    }  # fmt: skip


def test_an_uncaught_refusal_fails_the_run(open_ledger: LedgerFactory) -> None:
    tool = Other()

    @cp.workflow("strict")
    def flow(ctx: cp.Context) -> Any:
        return ctx.act("x", tool, size=1)

    with pytest.raises(cp.RunFailed, match="PolicyViolation") as failed:
        open_ledger().run(flow, run_id="r", options=cp.RunOptions(policy=policy()))
    assert isinstance(failed.value.cause, cp.ActFailed)
    assert tool.executed == []


def test_an_act_that_needs_approval_waits_with_the_pending_intent(
    open_ledger: LedgerFactory,
) -> None:
    tool = Counting()
    flow = acting(tool, {"size": 1}, {"size": 99})
    p = policy(
        risk={"counting": lambda t, params: "high" if params["size"] > 10 else "low"},
        approval_required={"high"},
    )
    with pytest.raises(cp.RunFrozen) as frozen:
        open_ledger().run(flow, run_id="r", options=cp.RunOptions(policy=p))
    assert frozen.value.status == "awaiting_approval"
    assert isinstance(frozen.value.cause, cp.ApprovalRequired)
    assert len(tool.executed) == 1
    info = open_ledger().get_run("r")
    assert info.status is cp.RunStatus.AWAITING_APPROVAL
    assert info.evidence is not None
    pending = info.evidence["pending_act"]
    assert pending["operation_id"] == "r/a1"
    assert pending["params"] == {"size": 99}
    assert pending["risk"] == "high"
    assert pending["policy"]["version"] == "p1"
    assert len(pending["intent_digest"]) == 64
    ledger = open_ledger()
    assert not [e for e in ledger._store.load_events("r") if e.type is EventType.ACT_INTENT][1:]
    # Resuming changes nothing: it waits for an approval.
    ledger.register(flow)
    with pytest.raises(cp.RunFrozen, match="awaiting_approval"):
        ledger.resume("r")
    assert len(tool.executed) == 1


def ledger_with(open_ledger: LedgerFactory, flow: Any, *policies: cp.Policy) -> cp.Ledger:
    ledger = open_ledger()
    ledger.register(flow)
    for p in policies:
        ledger.register_policy(p)
    return ledger


def stopped_run(open_ledger: LedgerFactory, tool: Counting, p: cp.Policy) -> Any:
    """A run bound to ``p``, stopped by its step budget after one act."""
    flow = acting(tool, {"size": 1}, {"size": 2})
    with pytest.raises(cp.RunStopped):
        open_ledger().run(
            flow, run_id="r", options=cp.RunOptions(policy=p, limits=cp.Limits(max_steps=1))
        )
    return flow


def test_resuming_under_another_policy_version_refuses(
    open_ledger: LedgerFactory, db_path: Path
) -> None:
    tool = Counting()
    v2 = policy("v2")
    # The first process: its ledger (which registered v1) is gone, and v1 with it.
    first = [cp.Ledger(f"sqlite:///{db_path}")]
    flow = stopped_run(lambda: first[0], tool, policy("v1"))
    first.pop().close()
    gc.collect()
    events = len(open_ledger()._store.load_events("r"))
    with pytest.raises(cp.PolicyMismatch) as mismatch:
        ledger_with(open_ledger, flow, v2).resume("r", raise_budget={"steps": 5})
    assert (mismatch.value.recorded, mismatch.value.offered) == ("v1", "v2")
    assert "bound to policy 'v1', but this process offers policy v2" in str(mismatch.value)
    with pytest.raises(cp.PolicyMismatch, match="offers no policy"):
        ledger_with(open_ledger, flow).resume("r")
    with pytest.raises(cp.PolicyMismatch, match="this call gives policy 'v2'"):
        open_ledger().run(flow, run_id="r", options=cp.RunOptions(policy=v2))
    changed = policy("v1", identity="someone else")
    with pytest.raises(cp.PolicyMismatch, match="policy 'v1' changed since"):
        ledger_with(open_ledger, flow, changed).resume("r")
    assert len(open_ledger()._store.load_events("r")) == events  # nothing written
    assert len(tool.executed) == 1
    del changed
    gc.collect()
    # The recorded version made in this process (as importing the module that builds it
    # does in a new process) is found without register_policy: the run goes on.
    v1 = policy("v1")
    assert len(ledger_with(open_ledger, flow).resume("r", raise_budget={"steps": 5})) == 2
    assert v1.version == "v1"


def test_rebinding_is_journaled_and_attributable(open_ledger: LedgerFactory) -> None:
    tool = Counting()
    v1 = policy("v1")
    v2 = policy("v2", allow={"counting": "1"}, identity="deploy-bot")
    flow = acting(tool, {"size": 1}, {"size": 2}, {"size": 3})
    with pytest.raises(cp.RunStopped):
        open_ledger().run(
            flow, run_id="r", options=cp.RunOptions(policy=v1, limits=cp.Limits(max_steps=1))
        )
    ledger = ledger_with(open_ledger, flow)  # v1 is not even available here
    with pytest.raises(cp.RunStopped):
        ledger.resume("r", rebind_policy=v2, raise_budget={"steps": 2}, by="carol")
    assert len(tool.executed) == 2
    events = ledger._store.load_events("r")
    rebound = [e for e in events if e.type is EventType.POLICY_REBOUND]
    assert len(rebound) == 1
    payload = rebound[0].payload
    assert payload["by"] == "carol"
    assert payload["host"]
    assert payload["old"] == v1.record()
    assert payload["new"] == v2.record()
    assert ledger.get_run("r").policy == v2.record()
    # From now on the run is bound to v2: v1 alone no longer fits, v2 does.
    with pytest.raises(cp.PolicyMismatch) as mismatch:
        open_ledger().run(flow, run_id="r", options=cp.RunOptions(policy=v1))
    assert (mismatch.value.recorded, mismatch.value.offered) == ("v2", "v1")
    # Re-binding to the policy already bound (a retried command) journals nothing more.
    again = ledger_with(open_ledger, flow).resume("r", rebind_policy=v2, raise_budget={"steps": 6})
    assert len(again) == 3
    assert len(tool.executed) == 3
    events = ledger._store.load_events("r")
    assert len([e for e in events if e.type is EventType.POLICY_REBOUND]) == 1


def test_a_finished_run_answers_without_its_policy(open_ledger: LedgerFactory) -> None:
    tool = Counting()
    flow = acting(tool, {"size": 1})
    open_ledger().run(flow, run_id="r", options=cp.RunOptions(policy=policy("v1")))
    assert ledger_with(open_ledger, flow).resume("r") == [{"n": 1}]
    assert ledger_with(open_ledger, flow, policy("v2")).resume("r") == [{"n": 1}]


def test_a_run_without_policy_can_be_bound_to_one(open_ledger: LedgerFactory) -> None:
    tool = Counting()
    flow = acting(tool, {"size": 1}, {"size": 2})
    with pytest.raises(cp.RunStopped):
        open_ledger().run(flow, run_id="r", options=cp.RunOptions(limits=cp.Limits(max_steps=1)))
    with pytest.raises(cp.PolicyMismatch, match="has no policy"):
        open_ledger().run(flow, run_id="r", options=cp.RunOptions(policy=policy()))
    strict = cp.Policy("strict", allow={})
    out = ledger_with(open_ledger, flow).resume(
        "r", rebind_policy=strict, raise_budget={"steps": 5}, by="dan"
    )
    assert out[0] == {"n": 1}
    assert out[1].startswith("refused: act 'a1' refused by policy")
    assert len(tool.executed) == 1


def test_one_content_per_policy_version_in_a_ledger(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()
    ledger.register_policy(policy("v1"))
    ledger.register_policy(policy("v1"))  # the same rules again: fine
    with pytest.raises(cp.CrashproofError, match="already registered with other rules"):
        ledger.register_policy(policy("v1", identity="x"))
    with pytest.raises(TypeError):
        cp.RunOptions(policy="v1")  # type: ignore[arg-type]
