"""Model and service outages never end a run, and a failed run is retried under its own
id: a real flaky server on 127.0.0.1 (429 with Retry-After, 500, then 200) driven through
httpx, sync and async, with a forge that opens pull requests by Idempotency-Key and
counts every request, so a duplicated effect or a re-asked decision shows."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

import crashproof as cp
from crashproof.journal.records import EventType
from crashproof.runtime.operations.audit import run_timeline
from crashproof.runtime.port import ActSettings


class Flaky:
    """``POST /chat`` answers the next scripted status (``429:SECONDS`` sends Retry-After),
    then 200 with a numbered answer; ``POST /pulls`` opens one pull request per
    Idempotency-Key (503 while ``pulls_down`` > 0); ``GET /pulls/KEY`` looks one up."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.pulls_down = 0
        self.requests: Counter[str] = Counter()
        self.pulls: dict[str, int] = {}
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def _send(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                flaky.requests[f"POST {self.path}"] += 1
                if self.path == "/chat":
                    status = flaky.script.pop(0) if flaky.script else "200"
                    code, _, wait = status.partition(":")
                    if code != "200":
                        self._send(
                            int(code), {"error": code}, {"Retry-After": wait} if wait else {}
                        )
                        return
                    n = flaky.requests["POST /chat"]
                    self._send(200, {"answer": f"plan-{n}", "usage": {"total_tokens": 7}})
                    return
                if flaky.pulls_down > 0:
                    flaky.pulls_down -= 1
                    self._send(503, {"error": "forge down"})
                    return
                key = self.headers["Idempotency-Key"]
                number = flaky.pulls.setdefault(key, len(flaky.pulls) + 1)
                self._send(201, {"number": number})

            def do_GET(self) -> None:
                flaky.requests["GET /pulls"] += 1
                number = flaky.pulls.get(self.path.removeprefix("/pulls/"))
                self._send(404 if number is None else 200, {"number": number})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def flaky() -> Iterator[Flaky]:
    server = Flaky()
    yield server
    server.http.shutdown()
    server.http.server_close()


def _answer(reply: httpx.Response) -> cp.Decision:
    """What a model recorder does with an answer: an outage is cp.Unavailable (with the
    service's Retry-After), a request error cp.PermanentError."""
    if reply.status_code == 429 or reply.status_code >= 500:
        hint = reply.headers.get("Retry-After")
        raise cp.Unavailable(
            f"{reply.status_code} from the model", retry_after=float(hint) if hint else None
        )
    if reply.status_code >= 400:
        raise cp.PermanentError(f"{reply.status_code}: the request is wrong")
    body = reply.json()
    return cp.Decision(body["answer"], model="m", usage=body["usage"])


class Forge(cp.Tool):
    """Pull requests by Idempotency-Key; a 503 means not opened (cp.Unavailable)."""

    name: ClassVar[str] = "forge"
    version: ClassVar[str] = "1"

    def __init__(self, url: str) -> None:
        self.url = url

    def execute(self, call: cp.Call) -> cp.Receipt:
        reply = httpx.post(
            f"{self.url}/pulls", json=call.params, headers={"Idempotency-Key": call.operation_id}
        )
        if reply.status_code == 503:
            raise cp.Unavailable("503 from the forge")
        return cp.Receipt(call.operation_id, reply.json(), call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        reply = httpx.get(f"{self.url}/pulls/{call.operation_id}")
        if reply.status_code == 404:
            return None
        return cp.Receipt(call.operation_id, reply.json(), call.intent_digest)


RETRY = cp.StepOptions(retry=cp.RetryPolicy(attempts=3, backoff=0.01, max_backoff=5.0))


def _agent(server: Flaky, directory: Path, shell: str) -> cp.Workflow[Any]:
    """A small agent, in the given shell: scan, ask the model, open a PR, run the tests
    (they fail while DIR/broken exists). Every scan and test run is counted."""
    forge = Forge(server.url)
    ran: Counter[str] = Counter()
    server.ran = ran  # type: ignore[attr-defined]

    def scan() -> str:
        ran["scan"] += 1
        return "repo"

    def test(plan: str) -> str:
        ran["test"] += 1
        if (directory / "broken").exists():
            raise ValueError("tests failed")
        return f"{plan}: green"

    def ask(prompt: str) -> cp.Decision:
        return _answer(httpx.post(f"{server.url}/chat", json={"prompt": prompt}))

    async def ask_async(prompt: str) -> cp.Decision:
        async with httpx.AsyncClient() as client:
            return _answer(await client.post(f"{server.url}/chat", json={"prompt": prompt}))

    if shell == "sync":

        @cp.workflow("agent", version="1")
        def agent(ctx: cp.Context) -> dict[str, Any]:
            repo = ctx.step("scan", scan)
            plan = ctx.decide("turn", ask, repo, options=RETRY)
            pr = ctx.act("open-pr", forge, title=plan)
            return {"plan": plan, "pr": pr["number"], "tests": ctx.step("test", test, plan)}

        return agent

    @cp.workflow("agent", version="1")
    async def agent_async(ctx: cp.AsyncContext) -> dict[str, Any]:
        repo = await ctx.step("scan", scan)
        plan = await ctx.decide("turn", ask_async, repo, options=RETRY)
        pr = await ctx.act("open-pr", forge, title=plan)
        return {"plan": plan, "pr": pr["number"], "tests": await ctx.step("test", test, plan)}

    return agent_async


def _drive(ledger: cp.Ledger, shell: str, call: str, *args: Any, **kw: Any) -> Any:
    """``ledger.<call>`` in the sync shell, ``<call>_async`` awaited in the async one
    (a retry there is ``resume_async(retry=True)``)."""
    if shell == "sync":
        return getattr(ledger, call)(*args, **kw)
    if call == "retry":
        call, kw = "resume", {**kw, "retry": True}
    return asyncio.run(getattr(ledger, f"{call}_async")(*args, **kw))


def _journal(ledger: cp.Ledger) -> list[Any]:
    return ledger.journal("r")


SHELLS = pytest.mark.parametrize("shell", ["sync", "async"])


@SHELLS
def test_every_attempt_is_journaled_and_retry_after_is_honoured(
    flaky: Flaky, tmp_path: Path, shell: str
) -> None:
    flaky.script = ["429:0.3", "500"]
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        started = time.monotonic()
        got = _drive(ledger, shell, "run", _agent(flaky, tmp_path, shell), run_id="r")
        took = time.monotonic() - started
        attempts = [e.payload for e in _journal(ledger) if e.type is EventType.ATTEMPT_FAILED]
        info = ledger.get_run("r")
    assert got == {"plan": "plan-3", "pr": 1, "tests": "plan-3: green"}
    assert flaky.requests["POST /chat"] == 3
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert [a["error"]["type"] for a in attempts] == ["crashproof.errors.Unavailable"] * 2
    assert attempts[0]["retry_in"] == 0.3  # the service's hint, larger than the policy's
    assert attempts[1]["retry_in"] == pytest.approx(0.02)  # the policy's own delay
    assert took >= 0.3
    assert {s.key: s.attempts for s in info.steps}["turn"] == 3


@SHELLS
def test_an_outage_past_the_retries_stops_the_run_and_resume_finishes_it(
    flaky: Flaky, tmp_path: Path, shell: str
) -> None:
    flaky.script = ["500", "429:0", "503"]  # three attempts, all out
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        agent = _agent(flaky, tmp_path, shell)
        with pytest.raises(cp.RunStopped) as stopped:
            _drive(ledger, shell, "run", agent, run_id="r")
        assert stopped.value.reason == "unavailable:turn: 503 from the model"
        assert "crashproof resume r" in str(stopped.value)
        info = ledger.get_run("r")
        assert (info.status, info.reason) == (cp.RunStatus.STOPPED, stopped.value.reason)
        # Nothing of the call is recorded as its result; nothing after it ran.
        done = [e.key for e in _journal(ledger) if e.type is EventType.STEP_DONE]
        assert done == ["scan"]
        assert flaky.requests["POST /pulls"] == 0
        # A resume after the outage: a fresh count of attempts, the scan replayed.
        flaky.script = ["500"]
        got = _drive(ledger, shell, "resume", "r")
        again = _drive(ledger, shell, "resume", "r")
        tail = [e for e in _journal(ledger) if e.key == "turn"]
    assert got == again == {"plan": "plan-5", "pr": 1, "tests": "plan-5: green"}
    assert flaky.requests["POST /chat"] == 5  # 3 + 2, none after the answer was recorded
    assert flaky.ran == {"scan": 1, "test": 1}  # type: ignore[attr-defined]
    assert flaky.pulls == {"r/open-pr": 1}
    kinds = [(e.type.value, e.payload.get("attempt")) for e in tail]
    assert kinds == [
        ("attempt_failed", 1),
        ("attempt_failed", 2),
        ("run_stopped", None),
        ("attempt_failed", 1),  # counted afresh after the stop
        ("step_done", 2),
    ]


def test_a_hint_beyond_max_backoff_stops_at_once_instead_of_sleeping(
    flaky: Flaky, tmp_path: Path
) -> None:
    flaky.script = ["429:3600"]
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        started = time.monotonic()
        with pytest.raises(cp.RunStopped, match="asks to wait 3600 s"):
            ledger.run(_agent(flaky, tmp_path, "sync"), run_id="r")
        assert time.monotonic() - started < 3
        stop = _journal(ledger)[-1]
        assert stop.type is EventType.RUN_STOPPED
        assert stop.payload["evidence"]["unavailable"]["retry_after"] == 3600
        assert flaky.requests["POST /chat"] == 1
        assert ledger.resume("r")["plan"] == "plan-2"


def test_without_a_retry_policy_the_first_outage_stops_the_run(
    flaky: Flaky, tmp_path: Path
) -> None:
    flaky.script = ["500"]

    def ask() -> cp.Decision:
        return _answer(httpx.post(f"{flaky.url}/chat", json={}))

    @cp.workflow("bare", version="1")
    def bare(ctx: cp.Context) -> Any:
        return ctx.decide("turn", ask)

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(cp.RunStopped):
            ledger.run(bare, run_id="b")
        assert ledger.get_run("b").status is cp.RunStatus.STOPPED
        assert ledger.resume("b") == "plan-2"


def test_a_permanent_error_fails_the_decision_and_the_workflow_can_catch_it(
    flaky: Flaky, tmp_path: Path
) -> None:
    flaky.script = ["400"]

    def ask() -> cp.Decision:
        return _answer(httpx.post(f"{flaky.url}/chat", json={}))

    @cp.workflow("careful", version="1")
    def careful(ctx: cp.Context) -> Any:
        try:
            return ctx.decide("turn", ask, options=RETRY)
        except cp.PermanentError as exc:
            return f"fallback: {exc}"

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        assert ledger.run(careful, run_id="c") == "fallback: 400: the request is wrong"
        assert ledger.resume("c") == "fallback: 400: the request is wrong"
        steps = {s.key: s.status for s in ledger.get_run("c").steps}
    assert steps == {"turn": cp.StepStatus.FAILED}
    assert flaky.requests["POST /chat"] == 1  # a permanent error is not retried: recorded


def test_an_act_whose_target_is_out_stops_the_run_and_opens_one_pr_on_resume(
    flaky: Flaky, tmp_path: Path
) -> None:
    flaky.pulls_down = 3
    settings = ActSettings(retryable_attempts=2, backoff=0.01)
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}", act_settings=settings) as ledger:
        with pytest.raises(cp.RunStopped, match="unavailable:open-pr: 503 from the forge"):
            ledger.run(_agent(flaky, tmp_path, "sync"), run_id="r")
        assert ledger.get_run("r").status is cp.RunStatus.STOPPED
        assert flaky.requests["POST /pulls"] == 2
        got = ledger.resume("r")  # one more 503 (retried), then opened
    assert got["pr"] == 1
    assert flaky.pulls == {"r/open-pr": 1}
    assert flaky.requests["POST /chat"] == 1  # the recorded decision was not asked again
    # Not looked up: the stop says its last attempt was a 503, not done (steps/outage.py).
    assert flaky.requests["GET /pulls"] == 0
    assert flaky.requests["POST /pulls"] == 4  # 2 before the stop, 2 after it


def test_an_act_cut_off_before_its_stop_is_recorded_is_looked_up_first(
    flaky: Flaky, tmp_path: Path
) -> None:
    """A crash between the last 503 and the stop's record: nothing in the journal says
    the last attempt was not done, so the resume looks it up before sending it again."""
    flaky.pulls_down = 3
    settings = ActSettings(retryable_attempts=2, backoff=0.01)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    points = cp.CrashPoints(match="before_commit[run_stopped:open-pr]")
    crashing = cp.Ledger(url, act_settings=settings, crash_points=points)
    with crashing, pytest.raises(cp.SimulatedCrash):
        crashing.run(_agent(flaky, tmp_path, "sync"), run_id="r")
    assert flaky.requests["POST /pulls"] == 2
    with cp.Ledger(url, act_settings=settings) as ledger:
        ledger.register(_agent(flaky, tmp_path, "sync"))
        assert ledger.resume("r")["pr"] == 1
    assert flaky.requests["GET /pulls"] == 1  # not found: then sent (a 503, then opened)
    assert flaky.pulls == {"r/open-pr": 1}


@SHELLS
def test_a_failed_run_is_retried_under_its_own_id_and_duplicates_nothing(
    flaky: Flaky, tmp_path: Path, shell: str
) -> None:
    (tmp_path / "broken").touch()
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        agent = _agent(flaky, tmp_path, shell)
        with pytest.raises(cp.RunFailed, match="tests failed"):
            _drive(ledger, shell, "run", agent, run_id="r")
        assert ledger.get_run("r").status is cp.RunStatus.FAILED
        assert flaky.pulls == {"r/open-pr": 1}
        (tmp_path / "broken").unlink()  # the cause fixed
        got = _drive(ledger, shell, "retry", "r", by="alice")
        assert _drive(ledger, shell, "resume", "r") == got
        timeline = run_timeline(ledger, "r")
        info = ledger.get_run("r")
    assert got == {"plan": "plan-1", "pr": 1, "tests": "plan-1: green"}
    assert info.status is cp.RunStatus.SUCCEEDED
    # The PR opened before the failure was not opened again, the decision not re-asked,
    # the scan not re-run: only the failed test ran again.
    assert flaky.requests["POST /pulls"] == 1
    assert flaky.requests["POST /chat"] == 1
    assert flaky.ran == {"scan": 1, "test": 2}  # type: ignore[attr-defined]
    retried = [e for e in timeline if e["type"] == "run_retried"]
    assert len(retried) == 1
    assert retried[0]["operator"]["by"] == "alice"
    assert "call 'test' attempted again" in retried[0]["summary"]


def test_retry_refuses_a_run_that_is_not_failed_and_writes_nothing(
    flaky: Flaky, tmp_path: Path
) -> None:
    flaky.script = ["500"] * 3
    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        agent = ledger.register(_agent(flaky, tmp_path, "sync"))
        with pytest.raises(cp.RunNotFound):
            ledger.retry("nope")
        with pytest.raises(cp.RunStopped):
            ledger.run(agent, run_id="r")
        before = len(_journal(ledger))
        with pytest.raises(cp.RetryRefused, match=r"is stopped, not failed.*crashproof resume r"):
            ledger.retry("r")
        assert len(_journal(ledger)) == before
        ledger.resume("r")
        with pytest.raises(cp.RetryRefused, match="is succeeded, not failed"):
            ledger.retry("r", by="bob")
        assert ledger.get_run("r").status is cp.RunStatus.SUCCEEDED
