"""Real `crashproof worker` processes on SQLite and PostgreSQL: racing to recover a crashed
run, taking over from a SIGKILLed worker, fencing out a worker paused with SIGSTOP, and
draining on SIGTERM (DESIGN.md section 7). Effects go through LineTool, which appends a
line per execute and never dedupes by itself, and through HttpTool to a server that
enforces fencing tokens: a duplicated or lost effect shows in the file or on the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from integration import worker_app
from integration.http_server import IdempotentServer

APP_DIR = Path(__file__).parent
LEASE = 2.0  # seconds: short, yet long enough for heartbeats on a loaded machine
WAIT = 60.0  # generous bound on a loaded machine; never reached when green


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'ledger.db'}"


class WorkerProcess:
    """One `crashproof worker` process; its JSON-lines log kept in a file."""

    def __init__(self, url: str, tmp: Path, name: str, **env: str) -> None:
        self.log = tmp / f"{name}.log"
        environ = {**os.environ, **env, "PYTHONPATH": str(APP_DIR)}
        command = [sys.executable, "-m", "crashproof", "worker", "--app", "worker_app"]
        options = ["--db", url, "--concurrency", "2", "--poll", "0.05", "--lease", str(LEASE)]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([*command, *options], cwd=APP_DIR, env=environ, stderr=log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                found.append(json.loads(line))
        return found

    def event(self, name: str, run_id: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events()
            if e["event"] == name and (run_id is None or e.get("run_id") == run_id)
        ]

    @property
    def worker_id(self) -> str:
        wait_for(lambda: self.event("worker_started"), f"{self.log.name} to start")
        return str(self.event("worker_started")[0]["worker"])

    def drain(self) -> int:
        """SIGTERM, then the exit code."""
        _ = self.worker_id  # its signal handlers are installed once it logged its start
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(WAIT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT)


@pytest.fixture
def workers(url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(name: str, **env: str) -> WorkerProcess:
        worker = WorkerProcess(url, tmp_path, name, **env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        with_cont = worker.proc.poll() is None
        if with_cont:
            worker.proc.send_signal(signal.SIGCONT)
        worker.kill()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    marks = tmp_path / "marks"
    marks.mkdir()
    return {"WORKER_LINES": str(tmp_path / "lines.txt"), "WORKER_MARKS": str(marks)}


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def succeeded(ledger: cp.Ledger, *run_ids: str) -> Callable[[], bool]:
    return lambda: all(ledger.get_run(r).status is cp.RunStatus.SUCCEEDED for r in run_ids)


def line_ids(env: dict[str, str]) -> list[str]:
    path = Path(env["WORKER_LINES"])
    text = path.read_text() if path.exists() else ""
    return [line.split(" ", 1)[0] for line in text.splitlines()]


def mark(env: dict[str, str], point: str, run_id: str, pid: int) -> bool:
    return (Path(env["WORKER_MARKS"]) / f"{point}.{run_id}.{pid}").exists()


def test_two_workers_racing_to_recover_a_crashed_run_perform_every_effect_once(
    url: str, env: dict[str, str], workers: Callable[..., WorkerProcess]
) -> None:
    # The run dies by SIGKILL after its second line was appended, before the receipt
    # was journaled: the effect happened, the journal does not know it yet.
    crash = subprocess.run(
        [
            sys.executable,
            "worker_app.py",
            "crash",
            url,
            "r",
            "4",
            "before_commit[step_done:line#2]",
        ],
        cwd=APP_DIR,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    assert line_ids(env) == ["r/line", "r/line#2"]

    first, second = workers("a", **env), workers("b", **env)
    with cp.Ledger(url) as ledger:
        wait_for(succeeded(ledger, "r"), "the run to be recovered")
        assert ledger.get_run("r").result == 4
    assert (first.drain(), second.drain()) == (0, 0)

    claims = first.event("claimed", "r") + second.event("claimed", "r")
    assert len(claims) == 1  # exactly one worker proceeded
    assert claims[0]["previous_owner"] is not None  # the crashed process's expired lease
    # Every effect exactly once: the crashed one found by lookup, the rest executed once.
    assert line_ids(env) == ["r/line", "r/line#2", "r/line#3", "r/line#4"]


def test_a_sigkilled_workers_run_is_finished_by_another_after_its_lease_expires(
    url: str, env: dict[str, str], workers: Callable[..., WorkerProcess]
) -> None:
    with cp.Ledger(url) as ledger:
        ledger.enqueue(worker_app.lines, run_id="k", n=3)
        doomed = workers("doomed", WORKER_PAUSE="60", **env)
        wait_for(lambda: mark(env, "think", "k", doomed.pid), "the first worker mid-run")
        doomed_id = doomed.worker_id
        rescuer = workers("rescuer", **env)
        assert rescuer.worker_id != doomed_id
        doomed.proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        doomed.proc.wait(WAIT)
        wait_for(succeeded(ledger, "k"), "the run to be finished by the rescuer")
    assert rescuer.drain() == 0

    (claim,) = rescuer.event("claimed", "k")
    assert claim["previous_owner"] == doomed_id
    assert rescuer.event("succeeded", "k")
    # The lease was never taken early: it had at most LEASE seconds left at the kill.
    claimed_at = _epoch(claim["ts"])
    assert claimed_at > killed_at
    assert claim["token"] >= 2
    assert line_ids(env) == ["k/line", "k/line#2", "k/line#3"]


def test_a_worker_paused_past_its_lease_is_fenced_out_when_it_resumes(
    url: str,
    env: dict[str, str],
    tmp_path: Path,
    workers: Callable[..., WorkerProcess],
) -> None:
    with IdempotentServer(tmp_path / "server.json") as server, cp.Ledger(url) as ledger:
        env = {**env, "WORKER_HTTP": server.url}
        ledger.enqueue(worker_app.lines, run_id="j", n=3)
        ledger.enqueue(worker_app.posting, run_id="h", size="s")
        # Both pause points sleep 4 s; the test freezes the whole process meanwhile:
        # "j" is inside a local step, "h" between its journaled intent and its request.
        stalled = workers("stalled", WORKER_PAUSE="4", **env)
        wait_for(
            lambda: mark(env, "think", "j", stalled.pid) and mark(env, "post", "h", stalled.pid),
            "the first worker at both pause points",
        )
        stalled.proc.send_signal(signal.SIGSTOP)
        stalled_id = stalled.worker_id
        time.sleep(LEASE)  # its leases run out: nothing renews them while it is stopped

        rescuer = workers("rescuer", **env)
        wait_for(succeeded(ledger, "j", "h"), "the rescuer to finish both runs")
        assert {c["previous_owner"] for c in rescuer.event("claimed")} == {stalled_id}

        stalled.proc.send_signal(signal.SIGCONT)
        wait_for(
            lambda: {e["run_id"] for e in stalled.event("lease_lost")} == {"j", "h"},
            "the resumed worker to find both leases lost",
        )
        assert (stalled.drain(), rescuer.drain()) == (0, 0)

        # Its next journal commit was refused, and so was its late request downstream.
        lost = {e["run_id"]: e["error"] for e in stalled.event("lease_lost")}
        # "j": refused before the store (the heartbeat saw the lease gone) or by the
        # store's fencing check in the commit's transaction; either way nothing kept.
        assert "lost to another worker" in lost["j"] or "was taken over" in lost["j"]
        assert "412" in lost["h"] or "fencing token" in lost["h"]
        posts = [r for r in server.requests("h/post") if r["method"] == "POST"]
        tokens = [int(_header(r, "Fencing-Token")) for r in posts]
        assert len(tokens) == 2  # the rescuer's, then the stale one
        assert tokens[1] < tokens[0]
        (resource,) = server.resources()  # nothing duplicated
        assert ledger.get_run("h").result["id"] == resource["id"]
        assert ledger.check() == [(r, None) for r in ("j", "h")]
        assert ledger.get_run("j").result == 3
    assert stalled.event("succeeded") == []
    assert sorted(line_ids(env)) == sorted(["j/line", "j/line#2", "j/line#3", "h/line"])


def _header(request: dict[str, Any], name: str) -> str:
    headers = {k.lower(): v for k, v in request["headers"].items()}
    return str(headers[name.lower()])


def _epoch(iso: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(iso).timestamp()


def test_sigterm_drains_a_worker_mid_step_and_another_finishes_the_run(
    url: str, env: dict[str, str], workers: Callable[..., WorkerProcess]
) -> None:
    with cp.Ledger(url) as ledger:
        ledger.enqueue(worker_app.lines, run_id="t", n=3)
        draining = workers("draining", WORKER_PAUSE="1", **env)
        wait_for(lambda: mark(env, "think", "t", draining.pid), "the worker mid-step")
        assert draining.drain() == 0  # SIGTERM during the step: it finishes, then exits 0
        info = ledger.get_run("t")
        # The step in progress was recorded; nothing after it started; the lease is free.
        assert [(s.key, s.status.value) for s in info.steps] == [
            ("think", "succeeded"),
            ("line", "succeeded"),
            ("think#2", "succeeded"),
        ]
        assert info.status is cp.RunStatus.RUNNING
        assert ledger.leases()["t"].owner is None
        assert [e["event"] for e in draining.event("released", "t")] == ["released"]
        assert line_ids(env) == ["t/line"]

        finisher = workers("finisher", **env)
        wait_for(succeeded(ledger, "t"), "another worker to finish the run")
        assert ledger.get_run("t").result == 3
    assert finisher.drain() == 0
    assert finisher.event("claimed", "t")[0]["previous_owner"] is None  # released, not expired
    assert line_ids(env) == ["t/line", "t/line#2", "t/line#3"]
