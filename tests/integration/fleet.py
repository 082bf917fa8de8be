"""A fleet with nobody at the keyboard (DESIGN.md section 15): four `crashproof worker`
processes drive runs of ``fleet_app`` while the faults of production hit them, and
nobody types a command. The runs are enqueued once; after that the only actors are the
workers, a supervisor that restarts every worker it finds dead, and the faults:

- workers SIGKILLed at seeded random points of progress (restarted at once);
- the model server down, connections refused, for longer than a call's retry budget
  (runs stop ``unavailable:...``; workers resume them with backoff);
- the outbox's receiver down while runs end (their messages stay pending; a worker's
  outbox pass delivers them);
- with a ``restart`` hook (PostgreSQL), the database stopped twice (``pg_ctl stop -m
  fast``, then ``immediate``, or the other way round, seeded) for a few seconds each,
  then started.

``Fleet.run()`` returns what the judge needs: every run's status, the effects at the
target by operation id, the model's requests with their arrival times, the outbox
deliveries, the workers' events. ``judge`` checks the invariants: every run finished,
0 duplicated effects, 0 lost, 0 decisions asked again after they were recorded, every
message delivered.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.journal.records import EventType
from integration import fleet_app  # the workflow the workers register (enqueued here)
from models.model_server import ModelServer, Turn

APP_DIR = Path(__file__).parent
TESTS = APP_DIR.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Model:
    """The OpenAI-wire model server, stopped and started again on the same port; the
    requests of every incarnation kept."""

    def __init__(self) -> None:
        self.port = _free_port()
        self._servers: list[ModelServer] = []
        self._server: ModelServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def up(self) -> None:
        if self._server is None:
            self._server = ModelServer(script=[Turn(text="go on")], by_turn=True, port=self.port)
            self._server.__enter__()
            self._servers.append(self._server)

    def down(self) -> None:
        if self._server is not None:
            self._server.__exit__(None, None, None)
            self._server = None

    def all_requests(self) -> list[dict[str, Any]]:
        return [request for server in self._servers for request in server.requests]


class Worker:
    """One `crashproof worker` process; each incarnation logs to its own file."""

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet, self.index, self.lives = fleet, index, 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.lives += 1
        log = self.fleet.tmp / f"worker{self.index}.{self.lives}.log"
        command = [sys.executable, "-m", "crashproof", "worker", "--app", "fleet_app"]
        options = [
            *("--db", self.fleet.url, "--concurrency", "2", "--poll", "0.1"),
            *("--lease", str(self.fleet.lease), "--retry-first", "0.5", "--retry-max", "2"),
            *("--outbox-every", "1"),
        ]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [*command, *options], cwd=APP_DIR, env=self.fleet.env, stderr=out
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def dead(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def busy(self) -> bool:
        """This incarnation has claimed a run: a kill now leaves work behind."""
        log = self.fleet.tmp / f"worker{self.index}.{self.lives}.log"
        return not self.dead() and '"event": "claimed"' in log.read_text(errors="replace")

    def drain(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Outcome:
    statuses: dict[str, str]
    effects: Counter[str]  # operation id -> lines at the target
    texts: list[str]  # the effects' texts, in order
    deliveries: Counter[str]  # "dedupe-key text" -> deliveries
    requests: list[dict[str, Any]]
    recorded: dict[tuple[str, int], float]  # (run, round) -> the decision's record time
    operator: list[str]  # records only a person's command writes (run: type)
    events: list[dict[str, Any]]
    faults: list[str]
    seconds: float


@dataclass
class Fleet:
    url: str
    tmp: Path
    seed: int
    runs: int
    rounds: int = 3
    workers: int = 4
    kills: int = 4
    lease: float = 3.0
    model_down: float = 4.0  # seconds; the call's retry budget is about 0.2 s
    db_down: float = 3.0
    restart: Callable[[str, float], None] | None = None  # the database's (mode, seconds)
    budget: float = float(os.environ.get("FLEET_BUDGET", "180"))
    env: dict[str, str] = field(default_factory=dict)

    def run(self) -> Outcome:
        rng = random.Random(self.seed)
        effects, outbox = self.tmp / "effects.txt", self.tmp / "outbox.txt"
        receiver_down = outbox.with_name(outbox.name + ".down")
        model = Model()
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(APP_DIR), str(TESTS)]),
            "FLEET_MODEL": model.url,
            "FLEET_EFFECTS": str(effects),
            "FLEET_OUTBOX": str(outbox),
            "FLEET_THINK": "0.2",
        }

        with cp.Ledger(self.url) as ledger:
            for i in range(self.runs):
                ledger.enqueue(fleet_app.fleet, run_id=f"run-{i:03d}", rounds=self.rounds)
        total = self.runs * self.rounds
        # Faults at seeded points of progress (effects written / effects expected).
        kills = sorted(rng.uniform(0.05, 0.9) for _ in range(self.kills))
        model_at = rng.uniform(0.1, 0.3)
        modes = rng.sample(["fast", "immediate"], 2)
        db_at = [rng.uniform(0.3, 0.45), rng.uniform(0.55, 0.7)] if self.restart else []
        receiver_back = rng.uniform(0.6, 0.8)
        receiver_down.touch()  # the receiver is out until then: messages stay pending
        model.up()
        began = time.monotonic()
        faults: list[str] = []
        fleet = [Worker(self, i) for i in range(self.workers)]
        model_up_at: float | None = None
        try:
            while True:
                if time.monotonic() - began > self.budget:
                    raise AssertionError(f"the fleet did not finish in {self.budget} s: {faults}")
                done = _lines(effects) / total
                busy = [worker for worker in fleet if worker.busy()]
                if kills and done >= kills[0] and busy:  # a worker with runs in hand
                    kills.pop(0)
                    victim = rng.choice(busy)
                    victim.kill()
                    faults.append(f"SIGKILL worker {victim.index} at {done:.0%}")
                if model_up_at is None and done >= model_at:
                    model.down()
                    model_up_at = time.monotonic() + self.model_down
                    faults.append(f"model down {self.model_down} s at {done:.0%}")
                if model_up_at is not None and time.monotonic() >= model_up_at:
                    model.up()
                if db_at and done >= db_at[0] and self.restart is not None:
                    db_at.pop(0)
                    mode = modes.pop(0)
                    faults.append(f"database stop -m {mode} for {self.db_down} s at {done:.0%}")
                    self.restart(mode, self.db_down)
                if receiver_down.exists() and done >= receiver_back:
                    receiver_down.unlink()
                    faults.append(f"outbox receiver back at {done:.0%}")
                for worker in fleet:  # the supervisor: a dead worker is started again
                    if worker.dead():
                        worker.start()
                if done >= 1 and not receiver_down.exists() and self._finished(outbox):
                    break
                time.sleep(0.1)
        finally:
            for worker in fleet:
                worker.drain()
            model.down()
            receiver_down.unlink(missing_ok=True)
        seconds = time.monotonic() - began
        return self._outcome(model, effects, outbox, faults, seconds)

    def _finished(self, outbox: Path) -> bool:
        """Every run ended and every message delivered (read as any client would; while the
        database is down, not yet)."""
        try:
            with cp.Ledger(self.url) as ledger:
                statuses = [info.status for info in ledger.runs()]
        except Exception:
            return False
        ended = len(statuses) == self.runs and all(s.terminal for s in statuses)
        return ended and len(_deliveries(outbox)) >= self.runs

    def _outcome(
        self, model: Model, effects: Path, outbox: Path, faults: list[str], seconds: float
    ) -> Outcome:
        statuses: dict[str, str] = {}
        recorded: dict[tuple[str, int], float] = {}
        operator: list[str] = []
        with cp.Ledger(self.url) as ledger:
            for info in ledger.runs():
                statuses[info.run_id] = info.status.value
                for event in ledger.journal(info.run_id, results=False):
                    if event.type is EventType.STEP_DONE and event.key in _DECISIONS:
                        recorded[(info.run_id, _DECISIONS[event.key])] = event.created_at
                    if event.type in _TYPED:
                        operator.append(f"{info.run_id}: {event.type.value}")
        lines = effects.read_text(encoding="utf-8").splitlines() if effects.exists() else []
        events = []
        for log in sorted(self.tmp.glob("worker*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    events.append(json.loads(line))
        return Outcome(
            statuses=statuses,
            effects=Counter(line.split(" ", 1)[0] for line in lines),
            texts=[line.split(" ", 1)[1] for line in lines],
            deliveries=_deliveries(outbox),
            requests=model.all_requests(),
            recorded=recorded,
            operator=operator,
            events=events,
            faults=faults,
            seconds=seconds,
        )


# Records that only an operator's command writes (resume with changes, retry, review,
# approval, override, cancel): a fleet with nobody at the keyboard has none.
_TYPED = {
    EventType.BUDGET_RAISED,
    EventType.POLICY_REBOUND,
    EventType.APPROVAL_GRANTED,
    EventType.REVIEW_DECIDED,
    EventType.INTENT_OVERRIDE,
    EventType.RUN_RETRIED,
    EventType.RUN_CANCELLED,
    EventType.COMPATIBILITY_VERDICT,
}
# The decision keys of the rounds: chat, chat#2, chat#3, ...
_DECISIONS = {("chat" if k == 0 else f"chat#{k + 1}"): k for k in range(100)}


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _deliveries(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(path.read_text().splitlines())


def judge(fleet: Fleet, outcome: Outcome) -> dict[str, Any]:
    """The invariants, as assertions; the numbers for the report."""
    runs = [f"run-{i:03d}" for i in range(fleet.runs)]
    assert outcome.statuses == dict.fromkeys(runs, "succeeded"), outcome.statuses
    assert not outcome.operator, f"records of a person's command: {outcome.operator}"
    duplicated = {op: n for op, n in outcome.effects.items() if n > 1}
    assert not duplicated, f"effects applied more than once: {duplicated}"
    expected = {f"{run}:{i}" for run in runs for i in range(fleet.rounds)}
    done = [text.rsplit(":", 1)[0] for text in outcome.texts]
    assert sorted(done) == sorted(expected), "an effect was lost or is foreign"
    # A decision asked again after its answer was recorded (invariant 3): a request that
    # reached the model after the journal's record of that round's decision.
    again = []
    for request in outcome.requests:
        content = request["body"]["messages"][0]["content"]
        run, _, round_ = content.rpartition(" round ")
        recorded_at = outcome.recorded.get((run, int(round_)))
        if recorded_at is None or request["at"] > recorded_at:
            again.append((run, round_, request["at"], recorded_at))
    assert not again, f"decisions asked again after they were recorded: {again}"
    assert len(outcome.recorded) == len(expected)
    # Every run's message reached the receiver: at least once, one dedupe key per run.
    delivered = {key.split(" ", 1)[1] for key in outcome.deliveries}
    assert delivered == {f"{run} done" for run in runs}, outcome.deliveries
    assert len({key.split(" ", 1)[0] for key in outcome.deliveries}) == len(runs)
    names = Counter(e["event"] for e in outcome.events)
    takeovers = sum(1 for e in outcome.events if e["event"] == "claimed" and e["previous_owner"])
    retries = sum(1 for e in outcome.events if e["event"] == "claimed" and e.get("retry"))
    dispatched = sum(
        e.get("delivered", 0) for e in outcome.events if e["event"] == "outbox_dispatched"
    )
    return {
        "runs": len(runs),
        "seconds": round(outcome.seconds, 1),
        "faults": outcome.faults,
        "effects": sum(outcome.effects.values()),
        "duplicated": 0,
        "lost": 0,
        "model_requests": len(outcome.requests),
        "decisions": len(outcome.recorded),
        "asked_again_after_recorded": 0,
        "commands_typed": 0,
        "takeovers_of_dead_workers": takeovers,
        "automatic_retries_of_stopped_runs": retries,
        "outbox_delivered_by_workers": dispatched,
        "deliveries": sum(outcome.deliveries.values()),
        "events": dict(names),
    }
