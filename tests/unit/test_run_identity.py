"""The run id is the run's idempotency key: same input → same run, other input → conflict."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections import Counter
from typing import Any

import pytest

import crashproof as cp

from ._support import LedgerFactory


def _counting(calls: Counter[str]) -> cp.Workflow[Any]:
    @cp.workflow("upgrade")
    def upgrade(ctx: cp.Context, repo: str, bump: int = 1) -> dict[str, Any]:
        version = ctx.step("read", lambda: calls.update(["read"]) or 1)
        return {"repo": repo, "version": version + bump}

    return upgrade


def _journal(ledger: cp.Ledger, run_id: str) -> Any:
    """The run as readers see it, plus its raw journal rows read behind the store's back."""
    path = ledger.url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT seq, type, key, payload, value, blob FROM events WHERE run_id = ? ORDER BY seq",
            (run_id,),
        ).fetchall()
    return ledger.get_run(run_id).to_json(), rows


def test_same_id_and_input_returns_the_recorded_result_without_running(
    open_ledger: LedgerFactory,
) -> None:
    calls: Counter[str] = Counter()
    upgrade = _counting(calls)
    first = open_ledger().run(upgrade, run_id="repo:x:upgrade", repo="x", bump=2)
    again = open_ledger().run(upgrade, run_id="repo:x:upgrade", bump=2, repo="x")
    assert first == again == {"repo": "x", "version": 3}
    assert calls == {"read": 1}
    assert len(open_ledger().runs()) == 1


def test_same_id_and_other_input_is_a_conflict_that_starts_nothing(
    open_ledger: LedgerFactory,
) -> None:
    calls: Counter[str] = Counter()
    upgrade = _counting(calls)
    ledger = open_ledger()
    ledger.run(upgrade, run_id="repo:x:upgrade", repo="x")
    before = _journal(ledger, "repo:x:upgrade")

    with pytest.raises(cp.RunConflict) as caught:
        open_ledger().run(upgrade, run_id="repo:x:upgrade", repo="y")

    conflict = caught.value
    assert conflict.run_id == "repo:x:upgrade"
    assert conflict.existing_digest == before[0]["input_digest"]
    assert conflict.existing_digest != conflict.new_digest
    for digest in (conflict.existing_digest, conflict.new_digest):
        assert re.fullmatch(r"[0-9a-f]{64}", digest)
        assert digest in str(conflict)
    assert calls == {"read": 1}
    assert _journal(open_ledger(), "repo:x:upgrade") == before


def test_a_conflict_on_an_unfinished_run_changes_nothing(open_ledger: LedgerFactory) -> None:
    calls: Counter[str] = Counter()
    upgrade = _counting(calls)
    crashing = open_ledger(crash_points=cp.CrashPoints(match="after_commit[step_done:read]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(upgrade, run_id="r1", repo="x")
    before = _journal(open_ledger(), "r1")

    with pytest.raises(cp.RunConflict):
        open_ledger().run(upgrade, run_id="r1", repo="x", bump=5)
    assert _journal(open_ledger(), "r1") == before
    assert before[0]["status"] == "running"

    assert open_ledger().run(upgrade, run_id="r1", repo="x") == {"repo": "x", "version": 2}
    assert calls == {"read": 1}


def test_input_digest_ignores_keyword_order_but_not_values(open_ledger: LedgerFactory) -> None:
    upgrade = _counting(Counter())
    ledger = open_ledger()
    ledger.run(upgrade, run_id="a", repo="x", bump=1)
    ledger.run(upgrade, run_id="b", bump=1, repo="x")
    ledger.run(upgrade, run_id="c", repo="x", bump=2)
    digests = {r.run_id: r.input_digest for r in ledger.runs()}
    assert digests["a"] == digests["b"] != digests["c"]


def test_a_failed_run_raises_run_failed_again_without_executing(
    open_ledger: LedgerFactory,
) -> None:
    calls: Counter[str] = Counter()

    @cp.workflow("doomed")
    def doomed(ctx: cp.Context) -> None:
        ctx.step("work", lambda: calls.update(["work"]) or 1)
        calls["body"] += 1
        raise RuntimeError("the plan is wrong")

    with pytest.raises(cp.RunFailed) as first:
        open_ledger().run(doomed, run_id="r1")
    assert isinstance(first.value.cause, RuntimeError)
    assert first.value.error["type"] == "builtins.RuntimeError"

    fresh = open_ledger()
    with pytest.raises(cp.RunFailed, match="the plan is wrong") as again:
        fresh.run(doomed, run_id="r1")
    with pytest.raises(cp.RunFailed):
        fresh.resume("r1")
    assert again.value.run_id == "r1"
    assert again.value.error == first.value.error
    assert calls == {"work": 1, "body": 1}
    info = fresh.get_run("r1")
    assert info.status is cp.RunStatus.FAILED
    assert info.reason == "builtins.RuntimeError: the plan is wrong"


def test_run_ids_must_be_non_empty_strings(open_ledger: LedgerFactory) -> None:
    ledger = open_ledger()
    with pytest.raises(ValueError, match="run_id"):
        ledger.run(_counting(Counter()), run_id="", repo="x")
    assert ledger.runs() == []
