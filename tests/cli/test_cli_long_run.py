"""No history limit, bounded here (the 100,000-turn version: ``bench/transcript.py
--turns 100000``): a long agent loop records, resumes after a crash, checks, and
``crashproof show`` pages through its steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.cli import main

TURNS = 3000


def model(messages: list[dict[str, str]]) -> dict[str, str]:
    return {"role": "assistant", "content": f"reply to {len(messages)}"}


def register(ledger: cp.Ledger) -> None:
    @ledger.workflow("long-agent", version="1")
    def agent(ctx: cp.Context, turns: int) -> int:
        history = cp.Transcript([{"role": "system", "content": "be brief"}])
        for turn in range(turns):
            history.append({"role": "user", "content": f"turn {turn}"})
            history.append(ctx.decide("turn", model, history))
        return len(history)


def test_a_long_run_resumes_checks_and_shows_a_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'long.db'}"
    crash = cp.CrashPoints(match=f"before_commit[step_done:turn#{TURNS}]")
    with cp.Ledger(url, durability="normal", crash_points=crash) as ledger:
        register(ledger)
        with pytest.raises(cp.SimulatedCrash):
            ledger.run("long-agent", run_id="long", turns=TURNS)
    with cp.Ledger(url, durability="normal") as ledger:
        register(ledger)
        assert ledger.resume("long") == 2 * TURNS + 1
    assert main(["check", "--db", url]) == 0
    capsys.readouterr()

    assert main(["show", "long", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "turn#200 " in out
    assert "turn#201 " not in out
    assert f"steps 1-200 of {TURNS}; next page: --from 201" in out
    assert main(["show", "long", "--from", "2990", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "turn#2990" in out
    assert f"turn#{TURNS}" in out
    assert "turn#2989 " not in out
    assert f"steps 2990-{TURNS} of {TURNS}" in out
    assert "next page" not in out

    assert main(["show", "long", "--json", "--from", "11", "--limit", "5", "--db", url]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [s["key"] for s in page["steps"]] == [f"turn#{n}" for n in range(11, 16)]
    assert page["steps_total"] == TURNS
    assert page["status"] == "succeeded"
    assert main(["show", "long", "--json", "--db", url]) == 0  # --json: every step
    assert len(json.loads(capsys.readouterr().out)["steps"]) == TURNS
