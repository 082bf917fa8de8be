"""A real `crashproof worker` process with --policy and --max-steps, on SQLite and
PostgreSQL: it drives the runs bound to that policy and those limits; a run whose act the
policy refuses fails with the refusal journaled, a run whose act needs approval waits in
awaiting_approval, a run out of budget stops, a run bound to no policy is refused before
anything executes and left runnable; the worker carries on and logs each in JSON lines,
and the tool's file shows that nothing the policy refused was executed."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

APP_DIR = Path(__file__).parent
# Imported under the name the worker imports it by: a policy's digest names its risk
# function by module.
sys.path.insert(0, str(APP_DIR))
policy_app = importlib.import_module("policy_app")


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def test_a_worker_drives_runs_under_its_policy_and_limits(url: str, tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    bound = cp.RunOptions(limits=policy_app.LIMITS, policy=policy_app.POLICY)
    runs = {
        "good": ["ok:1", "ok:2"],
        "outside": ["ok:3", "secret:4"],  # out of scope: refused, the run fails
        "risky": ["risky:5"],  # needs an approval: the run waits
        "long": ["ok:6", "ok:7", "ok:8", "ok:9"],  # a fourth step is past max_steps=3
    }
    with cp.Ledger(url) as ledger:
        for run_id, texts in runs.items():
            ledger.enqueue(policy_app.writes, run_id=run_id, options=bound, texts=texts)
        ledger.enqueue(policy_app.writes, run_id="unbound", texts=["ok:10"])

    command = [sys.executable, "-m", "crashproof", "worker", "--app", "policy_app", "--db", url]
    options = ["--policy", "policy_app:POLICY", "--max-steps", "3", "--until-idle"]
    done = subprocess.run(
        [*command, *options, "--poll", "0.05", "--concurrency", "2"],
        cwd=APP_DIR,
        env={**os.environ, "PYTHONPATH": str(APP_DIR), "POLICY_LINES": str(lines)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    log = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    started = log[0]
    assert started["event"] == "worker_started"
    assert started["policy"] == "lines-2026-11"
    assert started["limits"]["steps"] == 3
    ended = {e["run_id"]: e for e in log if "run_id" in e and e["event"] != "claimed"}
    assert ended["good"]["event"] == "succeeded", ended["good"].get("error")
    assert ended["outside"]["event"] == "failed"
    assert "scope" in ended["outside"]["error"]
    assert ended["risky"]["event"] == "frozen"
    assert ended["risky"]["status"] == "awaiting_approval"
    assert ended["long"]["event"] == "stopped"
    assert ended["long"]["reason"] == "budget:steps"
    assert ended["unbound"]["event"] == "refused", ended["unbound"]
    assert "started with limits" in ended["unbound"]["error"]
    assert log[-1]["event"] == "worker_stopped"

    # Executed: exactly the acts the policy and the budget allowed, once each.
    executed = lines.read_text().splitlines() if lines.exists() else []
    assert sorted(executed) == sorted(
        ["good ok:1", "good ok:2", "outside ok:3", "long ok:6", "long ok:7", "long ok:8"]
    )
    with cp.Ledger(url) as ledger:
        ledger.register(policy_app.writes)
        status: dict[str, Any] = {info.run_id: info.status for info in ledger.runs()}
        assert status == {
            "good": cp.RunStatus.SUCCEEDED,
            "outside": cp.RunStatus.FAILED,
            "risky": cp.RunStatus.AWAITING_APPROVAL,
            "long": cp.RunStatus.STOPPED,
            "unbound": cp.RunStatus.RUNNING,  # untouched: left for another worker
        }
        refused = ledger.get_run("outside").steps[-1]  # journaled as a failed act
        assert (refused.key, refused.status.value, refused.failure) == (
            "line#2",
            "failed",
            "policy",
        )
        assert refused.attempts == 0
        assert ledger.leases()["unbound"].owner is None  # released at once
