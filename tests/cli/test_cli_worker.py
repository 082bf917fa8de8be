"""`crashproof worker`, `runs` with owners and leases, and `resume --wait`."""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.cli import ExitCode
from crashproof.store.sqlite import SQLiteStore

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result


def enqueue(project: Path, *names: str) -> None:
    sys.path.insert(0, str(project))
    flows = importlib.import_module("flows")
    with cp.Ledger(f"sqlite:///{project / 'crashproof.db'}") as ledger:
        for name in names:
            ledger.enqueue(flows.greet, run_id=f"greet:{name}", name=name)


def test_worker_drives_queued_runs_and_logs_json_lines(
    project: Path, cli: Cli, calls: Callable[[], list[str]]
) -> None:
    enqueue(project, "ada", "bob", "cy")
    done = cli("worker", "--app", "flows", "--until-idle", "--poll", "0.05", "-c", "2")
    assert done.code == ExitCode.OK, done.err
    events = [json.loads(line) for line in done.err.splitlines() if line.startswith("{")]
    succeeded = sorted(e["run_id"] for e in events if e["event"] == "succeeded")
    assert succeeded == ["greet:ada", "greet:bob", "greet:cy"]
    assert {e["worker"] for e in events} == {events[0]["worker"]}
    assert sorted(calls()) == sorted(["compose", "choose"] * 3)
    shown = cli("show", "greet:bob", "--json")
    assert shown.json()["result"] == {"text": "hello bob", "times": 1}


def test_worker_refuses_bad_settings_before_starting(project: Path, cli: Cli) -> None:
    enqueue(project, "ada")
    bad = cli("worker", "--app", "flows", "--concurrency", "0")
    assert bad.code == ExitCode.USAGE
    assert "--concurrency must be >= 1" in bad.err
    assert "nothing was started" in bad.err
    for option, value in (("--retry-first", "0"), ("--retry-max", "nan"), ("--retry-max", "inf")):
        bad = cli("worker", "--app", "flows", option, value)
        assert bad.code == ExitCode.USAGE, (option, value, bad.err)
        assert "--retry-first must be > 0 and at most --retry-max" in bad.err
        assert "Traceback" not in bad.err
    bad = cli("worker", "--app", "flows", "--outbox-every", "0")
    assert bad.code == ExitCode.USAGE
    assert "--outbox-every > 0" in bad.err


def test_runs_shows_owner_and_lease(project: Path, cli: Cli) -> None:
    enqueue(project, "held", "orphan", "waiting")
    store = SQLiteStore(project / "crashproof.db")
    try:
        store.claim("greet:held", "elsewhere:1:abcd", 600.0)
        store.claim("greet:orphan", "dead:2:beef", 0.01)
    finally:
        store.close()
    time.sleep(0.05)
    shown = cli("runs")
    assert shown.code == ExitCode.OK, shown.err
    rows = {line.split()[0]: line for line in shown.out.splitlines() if "greet:" in line}
    assert "elsewhere:1:abcd" in rows["greet:held"]
    assert "until " in rows["greet:held"]
    assert "dead:2:beef" in rows["greet:orphan"]
    assert "orphaned, expired" in rows["greet:orphan"]
    assert "waiting for a worker" in rows["greet:waiting"]
    records = {r["run_id"]: r for r in cli("runs", "--json").json()}
    assert records["greet:held"]["owner"] == "elsewhere:1:abcd"
    assert records["greet:held"]["lease_expires_at"] > time.time() + 500
    assert (records["greet:waiting"]["owner"], records["greet:waiting"]["lease_expires_at"]) == (
        None,
        None,
    )


def test_resume_wait_proceeds_once_the_holder_releases(project: Path, cli: Cli) -> None:
    enqueue(project, "ada")
    store = SQLiteStore(project / "crashproof.db")
    lease = store.claim("greet:ada", "elsewhere:1:abcd", 600.0)
    refused = cli("resume", "greet:ada", "--app", "flows", "--wait", "0.2")
    assert refused.code == ExitCode.CONFLICT
    assert "owned by worker elsewhere:1:abcd" in refused.err
    timer = threading.Timer(0.3, lambda: store.release("greet:ada", lease))
    timer.start()
    try:
        waited = cli("resume", "greet:ada", "--app", "flows", "--wait", "30")
    finally:
        timer.join()
        store.close()
    assert waited.code == ExitCode.OK, waited.err
    assert json.loads(waited.out) == {"text": "hello ada", "times": 1}


def test_worker_async_drives_async_and_sync_runs_on_one_loop(
    project: Path, cli: Cli, calls: Callable[[], list[str]]
) -> None:
    enqueue(project, "ada")
    (project / "ready.txt").write_text("", encoding="utf-8")
    flows = importlib.import_module("flows")
    with cp.Ledger(f"sqlite:///{project / 'crashproof.db'}") as ledger:
        ledger.enqueue(flows.agreet, run_id="agreet:bob", name="bob")
    done = cli("worker", "--app", "flows", "--async", "--until-idle", "--poll", "0.05")
    assert done.code == ExitCode.OK, done.err
    events = [json.loads(line) for line in done.err.splitlines() if line.startswith("{")]
    assert events[0]["on_loop"] is True
    assert sorted(e["run_id"] for e in events if e["event"] == "succeeded") == [
        "agreet:bob",
        "greet:ada",
    ]
    assert sorted(calls()) == ["acompose", "choose", "compose"]
