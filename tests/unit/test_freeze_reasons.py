"""A tool's message in the reason of a freeze, a refusal or a failure (runtime/steps/acts.py,
driving/drive_records.py): one line, its start and its end kept around " … " and bounded
(``crashproof._excerpt.shown``), as in a stop's; the whole of it in the evidence or the
error record. Real runs, each met by a 100 KB message of several lines whose why is last."""

from __future__ import annotations

from typing import Any

import pytest

import crashproof as cp
from crashproof.tools.port import Call

WHY = "the why, at the end"
HUGE = "what failed at " + "/x\n" * 35_000 + ": " + WHY  # about 100 KB, 35,000 lines
BOUND = 563  # shown's: 200 characters of the start, " … ", 360 of the end
FLAT = " ".join(HUGE.split())


class Faulty(cp.Tool):
    """Meets ``HUGE`` where ``where`` says: in prepare, execute or lookup."""

    name = "faulty"

    def __init__(self, where: str) -> None:
        self.where = where

    def prepare(self, call: Call) -> dict[str, Any] | None:
        if self.where == "busy":
            raise cp.ResourceBusy(HUGE)
        if self.where == "refused":
            raise cp.PermanentError(HUGE)
        return None

    def execute(self, call: Call) -> cp.Receipt:
        if self.where == "drift":
            raise cp.DriftError(HUGE)
        if self.where == "failed":
            raise cp.PermanentError(HUGE)
        raise TimeoutError("no answer")  # an unknown outcome: looked up

    def lookup(self, call: Call) -> cp.Receipt | None:
        if self.where == "unknown":
            raise cp.OutcomeUnknown(HUGE)
        raise NotImplementedError(HUGE)  # "unsupported": the tool says why it cannot


def _run(where: str) -> tuple[BaseException, cp.RunInfo, list[Any]]:
    with cp.Ledger("memory://") as ledger:

        @ledger.workflow("faulty", version="1")
        def flow(ctx: cp.Context) -> Any:
            return ctx.act("act", Faulty(where), value=1)

        with pytest.raises((cp.RunFrozen, cp.RunFailed)) as raised:
            ledger.run(flow, run_id="r")
        return raised.value, ledger.get_run("r"), ledger.journal("r")


def _bounded(reason: str, start: str) -> None:
    assert reason.startswith(start)
    assert "\n" not in reason
    assert " … " in reason
    assert WHY in reason  # the end kept
    assert len(reason) < len(start) + BOUND + 100  # bounded: the message was 100 KB


@pytest.mark.parametrize(
    ("where", "start", "evidence"),
    [
        ("unknown", "act 'act': faulty cannot tell whether operation ", "lookup_error"),
        ("unsupported", "act 'act' (faulty) may or may not have happened, and ", "lookup_error"),
        ("drift", "act 'act': the target drifted (what failed at /x /x", "drift"),
        ("busy", "act 'act': what failed at /x /x", "busy"),
    ],
)
def test_a_freeze_shows_a_huge_message_bounded_and_keeps_all_of_it(
    where: str, start: str, evidence: str
) -> None:
    frozen, info, _ = _run(where)
    assert isinstance(frozen, cp.RunFrozen)
    assert frozen.reason == info.reason
    _bounded(str(info.reason), start)
    assert (info.evidence or {})[evidence]["message"] == HUGE  # the whole, as raised


@pytest.mark.parametrize(
    ("where", "start"),
    [
        ("refused", "act 'act' refused by faulty: what failed at /x /x"),
        ("failed", "act 'act' failed permanently: what failed at /x /x"),
    ],
)
def test_a_refusal_or_a_failure_shows_it_bounded_and_records_all_of_it(
    where: str, start: str
) -> None:
    failed, info, journal = _run(where)
    assert isinstance(failed, cp.RunFailed)
    assert isinstance(failed.cause, cp.ActFailed)  # what the workflow met
    assert info.status is cp.RunStatus.FAILED
    _bounded(str(failed.cause), start)
    _bounded(str(info.reason), f"crashproof.errors.ActFailed: {start}")
    _bounded(str(failed), f"run 'r' failed: crashproof.errors.ActFailed: {start}")
    done = next(e for e in journal if e.type.value == "step_done" and e.key == "act")
    assert done.payload["cause"]["message"] == HUGE  # the tool's error, whole


def test_a_workflow_s_own_huge_error_fails_the_run_with_a_bounded_reason() -> None:
    with cp.Ledger("memory://") as ledger:

        @ledger.workflow("raises", version="1")
        def flow(ctx: cp.Context) -> Any:
            raise ValueError(HUGE)

        with pytest.raises(cp.RunFailed) as failed:
            ledger.run(flow, run_id="r")
        info = ledger.get_run("r")
        ended = [e for e in ledger.journal("r") if e.type.value == "run_failed"][-1]
    _bounded(str(info.reason), "builtins.ValueError: what failed at /x /x")
    _bounded(str(failed.value), "run 'r' failed: builtins.ValueError: what failed at /x /x")
    assert failed.value.error["message"] == HUGE
    assert ended.payload["error"]["message"] == HUGE
    assert len(FLAT) > 60_000  # what the reason was before: the whole message, one line
