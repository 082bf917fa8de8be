"""What an unknown outcome means for a tool that cannot look it up (``cp.OnUnknown``):
``review`` freezes, ``at_least_once`` sends again under the same operation id,
``at_most_once`` records the act as not done and the run goes on. The declaration is
journaled with the intent, and the recorded one wins on resume. Sync and async shells.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.port import ActSettings

pytestmark = pytest.mark.timeout(60)

FAST = ActSettings(retryable_attempts=3, lookup_attempts=2, backoff=0.01)
IN_FLIGHT = "after_commit[act_intent:send]"  # the intent is durable, the effect unknown


class Mailer(cp.Tool):
    """Cannot look up; the first ``lose`` replies are lost after the send (unknown)."""

    name: ClassVar[str] = "mailer"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False

    def __init__(self, on_unknown: cp.OnUnknown, lose: int = 0) -> None:
        self.on_unknown = on_unknown
        self.lose = lose
        self.sent: list[str] = []

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.sent.append(call.operation_id)
        if self.lose:
            self.lose -= 1
            raise TimeoutError("the reply was lost")
        return cp.Receipt(call.operation_id, {"sent": call.operation_id})


LedgerFactory = Callable[..., cp.Ledger]


@pytest.fixture
def ledger_at(tmp_path: Path) -> Iterator[LedgerFactory]:
    opened: list[cp.Ledger] = []

    def factory(**kwargs: Any) -> cp.Ledger:
        kwargs.setdefault("act_settings", FAST)
        ledger = cp.Ledger(f"sqlite:///{tmp_path}/l.db", **kwargs)
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()


def mail(mailer: Mailer) -> cp.Workflow[Any]:
    @cp.workflow("mail", version="1")
    def flow(ctx: cp.Context) -> Any:
        try:
            sent = ctx.act("send", mailer, to="ops")
        except cp.ActNotDone as exc:
            sent = {"not_done": str(exc)}
        return {"send": sent, "after": ctx.step("after", lambda: "went on")}

    return flow


def amail(mailer: Mailer) -> cp.Workflow[Any]:
    @cp.workflow("mail", version="1")
    async def flow(ctx: cp.AsyncContext) -> Any:
        try:
            sent = await ctx.act("send", mailer, to="ops")
        except cp.ActNotDone as exc:
            sent = {"not_done": str(exc)}
        return {"send": sent, "after": await ctx.step("after", lambda: "went on")}

    return flow


def drive(ledger: cp.Ledger, flow: cp.Workflow[Any], shell: str, *, resume: bool = False) -> Any:
    if shell == "sync":
        return ledger.resume("m") if resume else ledger.run(flow, run_id="m")
    if resume:
        return asyncio.run(ledger.resume_async("m"))
    return asyncio.run(ledger.run_async(flow, run_id="m"))


def intents(ledger: cp.Ledger) -> list[dict[str, Any]]:
    return [e.payload for e in ledger._store.load_events("m") if e.type is EventType.ACT_INTENT]


SHELLS = ["sync", "async"]


def build(shell: str, mailer: Mailer) -> cp.Workflow[Any]:
    return mail(mailer) if shell == "sync" else amail(mailer)


@pytest.mark.parametrize("shell", SHELLS)
def test_at_least_once_sends_again_under_the_same_operation_id(
    ledger_at: LedgerFactory, shell: str
) -> None:
    mailer = Mailer(cp.OnUnknown.AT_LEAST_ONCE, lose=1)
    ledger = ledger_at()
    out = drive(ledger, build(shell, mailer), shell)
    assert out["send"] == {"sent": "m/send"}
    assert mailer.sent == ["m/send", "m/send"]  # same id: a deduping target keeps one
    assert [i.get("on_unknown") for i in intents(ledger)] == ["at_least_once"] * 2
    assert ledger.review_cases("m") == []


@pytest.mark.parametrize("shell", SHELLS)
def test_at_most_once_records_not_done_and_goes_on(ledger_at: LedgerFactory, shell: str) -> None:
    mailer = Mailer(cp.OnUnknown.AT_MOST_ONCE, lose=1)
    ledger = ledger_at()
    flow = build(shell, mailer)
    out = drive(ledger, flow, shell)
    assert "recorded as not done" in out["send"]["not_done"]
    assert out["after"] == "went on"
    assert mailer.sent == ["m/send"]  # never twice
    step = next(s for s in ledger.get_run("m").steps if s.key == "send")
    assert (step.status.value, step.failure) == ("failed", "not_done")
    done = [e for e in ledger._store.load_events("m") if e.type is EventType.STEP_DONE]
    assert done[0].payload["not_done"] == {"on_unknown": "at_most_once"}
    assert done[0].payload["cause"]["message"] == "the reply was lost"
    # Replayed identically: the same ActNotDone, nothing sent.
    again = ledger_at()
    again.register(flow)
    assert drive(again, flow, shell, resume=True) == out
    assert mailer.sent == ["m/send"]


@pytest.mark.parametrize("meaning", list(cp.OnUnknown))
def test_an_act_left_in_flight_is_settled_as_declared(
    ledger_at: LedgerFactory, meaning: cp.OnUnknown
) -> None:
    mailer = Mailer(meaning)
    flow = mail(mailer)
    crashing = ledger_at(crash_points=cp.CrashPoints(match=IN_FLIGHT))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow, run_id="m")
    assert mailer.sent == []
    ledger = ledger_at()
    ledger.register(flow)
    if meaning is cp.OnUnknown.REVIEW:
        with pytest.raises(cp.RunFrozen, match="cannot look it up"):
            ledger.resume("m")
        (case,) = ledger.review_cases("m")
        assert case.evidence["frozen"]["no_lookup"] is True
        assert mailer.sent == []
        return
    out = ledger.resume("m")
    if meaning is cp.OnUnknown.AT_LEAST_ONCE:
        assert (out["send"], mailer.sent) == ({"sent": "m/send"}, ["m/send"])
    else:
        assert "not_done" in out["send"]
        assert mailer.sent == []
    assert ledger.get_run("m").status.value == "succeeded"


@pytest.mark.parametrize(
    ("recorded", "now", "frozen"),
    [
        (cp.OnUnknown.REVIEW, cp.OnUnknown.AT_LEAST_ONCE, True),
        (cp.OnUnknown.AT_MOST_ONCE, cp.OnUnknown.AT_LEAST_ONCE, False),
    ],
)
def test_the_recorded_declaration_wins_over_changed_code(
    ledger_at: LedgerFactory, recorded: cp.OnUnknown, now: cp.OnUnknown, frozen: bool
) -> None:
    crashing = ledger_at(crash_points=cp.CrashPoints(match=IN_FLIGHT))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(mail(Mailer(recorded)), run_id="m")
    changed = Mailer(now)  # new code: another declaration for the same tool
    ledger = ledger_at()
    ledger.register(mail(changed))
    if frozen:
        with pytest.raises(cp.RunFrozen):
            ledger.resume("m")
    else:
        assert "not_done" in ledger.resume("m")["send"]
    assert changed.sent == []  # neither resent


def test_an_unknown_declaration_is_refused_before_anything_is_sent(
    ledger_at: LedgerFactory,
) -> None:
    mailer = Mailer(cp.OnUnknown.REVIEW)
    mailer.on_unknown = "maybe"  # type: ignore[assignment]
    ledger = ledger_at()
    with pytest.raises(cp.CrashproofError, match="on_unknown='maybe'"):
        ledger.run(mail(mailer), run_id="m")
    assert mailer.sent == []
    assert ledger.get_run("m").status.value == "running"  # not failed: fix the code, resume


@pytest.mark.parametrize("decision", ["replan", "keep"])
def test_a_decided_case_is_finished_by_a_worker(
    ledger_at: LedgerFactory, tmp_path: Path, decision: str
) -> None:
    from crashproof.integrity.signing import generate_keypair

    mailer = Mailer(cp.OnUnknown.REVIEW, lose=1)
    ledger = ledger_at()
    flow = mail(mailer)
    with pytest.raises(cp.RunFrozen):
        ledger.run(flow, run_id="m")
    generate_keypair(tmp_path / "bob.pem")
    ledger.add_approver("bob", (tmp_path / "bob.pem.pub").read_text())
    (case,) = ledger.review_cases("m")
    assert case.decisions == ["replan", "keep", "abort"]
    ledger.decide(case.case_id, decision, key=tmp_path / "bob.pem", no_reread=True)
    log = io.StringIO()
    assert cp.Worker(ledger, poll=0.05, until_idle=True, log=log).serve() == 0
    info = ledger.get_run("m")
    assert info.status.value == "succeeded", log.getvalue()
    if decision == "replan":
        assert (info.result["send"], mailer.sent) == ({"sent": "m/send@2"}, ["m/send", "m/send@2"])
    else:
        assert "not_done" in info.result["send"]
        assert mailer.sent == ["m/send"]
        step = next(s for s in info.steps if s.key == "send")
        assert step.failure == "not_done"
