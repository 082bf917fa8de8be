"""HttpTool against a real HTTP server on loopback: the act protocol's crash windows.

Every test runs the real ``IdempotentServer`` (tests/integration/http_server.py) and a
real SQLite ledger; the crash tests SIGKILL a child process (http_child.py) at named
crash points and resume in this process with a new Ledger.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import crashproof as cp
from crashproof.runtime.port import ActSettings
from crashproof.runtime.steps.act_records import intent_digest
from crashproof.tools.http import HttpTool, LookupFailed, wire_key

from .http_child import make_tool, make_workflow
from .http_server import IdempotentServer, parse_key

pytestmark = pytest.mark.timeout(30)

CHILD = Path(__file__).parent / "http_child.py"
RUN = "run"
K1, K2 = f"{RUN}/create", f"{RUN}/create#2"
EXPECTED_BODIES = [{"name": "a"}, {"name": "b"}]
FAST = ActSettings(retryable_attempts=3, lookup_attempts=4, backoff=0.01)

LedgerFactory = Callable[..., cp.Ledger]


@pytest.fixture
def ledger_at(tmp_path: Path) -> Iterator[LedgerFactory]:
    """New Ledger objects on ``<tmp_path>/l.db`` (as a restarted process would open);
    all closed at teardown."""
    opened: list[cp.Ledger] = []

    def factory(**kwargs: Any) -> cp.Ledger:
        kwargs.setdefault("act_settings", FAST)
        ledger = cp.Ledger(f"sqlite:///{tmp_path}/l.db", **kwargs)
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()


def run_create_two(ledger: cp.Ledger, tool: HttpTool) -> Any:
    return ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])


def digest_of(tool: HttpTool, name: str, key: str = "create") -> str:
    return intent_digest(tool, {"body": {"name": name}}, key)


def assert_one_resource_per_key(server: IdempotentServer, result: Any = None) -> None:
    by_key: dict[str, int] = {}
    for resource in server.resources():
        by_key[resource["idempotency_key"]] = by_key.get(resource["idempotency_key"], 0) + 1
    assert by_key == {K1: 1, K2: 1}
    if result is not None:
        assert result["bodies"] == EXPECTED_BODIES
        assert result["ids"] == [server.resource(K1)["id"], server.resource(K2)["id"]]  # type: ignore[index]


def step(ledger: cp.Ledger, key: str) -> cp.StepInfo:
    return next(s for s in ledger.get_run(RUN).steps if s.key == key)


# -- packaging ---------------------------------------------------------------


def test_import_crashproof_does_not_import_httpx() -> None:
    code = "import sys, crashproof; print('httpx' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=20
    )
    assert out.stdout.strip() == "False"


def test_supports_lookup_follows_lookup_path(server: IdempotentServer) -> None:
    with HttpTool(server.url, "/resources") as bare:
        assert bare.supports_lookup is False
    with make_tool(server.url) as full:
        assert full.supports_lookup is True
        assert (full.name, full.version) == ("http", "1")
        assert full.idempotent_execute
        assert full.honours_fencing


def test_server_control_endpoint_and_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with IdempotentServer(state) as first:
        httpx.post(f"{first.url}/_control", json={"fail_lookups": 1}, timeout=5)
        assert httpx.get(f"{first.url}/resources/by-key/k", timeout=5).status_code == 500
        assert httpx.get(f"{first.url}/resources/by-key/k", timeout=5).status_code == 404
        first.seed("k", "d" * 64, {"name": "kept"})
    with IdempotentServer(state) as second:  # a restart keeps resources and counts
        assert second.resource("k") == first.resource("k")
        assert second.count("k", "GET") == 2
        answer = httpx.get(f"{second.url}/resources/by-key/k", timeout=5)
        assert answer.json()["body"] == {"name": "kept"}
        assert answer.headers["Crashproof-Intent-Digest"] == "d" * 64


# -- the happy path ----------------------------------------------------------


def test_happy_path_one_resource_per_operation_headers_and_replay(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    ledger = ledger_at()
    result = run_create_two(ledger, tool)

    assert_one_resource_per_key(server, result)
    for key in (K1, K2):
        assert (server.count(key, "POST"), server.count(key, "GET")) == (1, 0)
    sent = server.requests(K1)[0]["headers"]
    assert sent["Idempotency-Key"] == '"run/create"'  # an RFC 8941 sf-string
    assert parse_key(sent["Idempotency-Key"]) == "run/create"
    assert sent["Crashproof-Intent-Digest"] == step(ledger, "create").intent_digest
    assert sent["Crashproof-Intent-Digest"] == digest_of(tool, "a")
    assert sent["Fencing-Token"] == "1"  # the token of the run's lease (its first claim)
    assert parse_key(server.requests(K2)[0]["headers"]["Idempotency-Key"]) == K2

    info = ledger.get_run(RUN)
    assert info.status is cp.RunStatus.SUCCEEDED
    assert [(s.key, s.status, s.operation_id, s.attempts) for s in info.steps] == [
        ("create", cp.StepStatus.SUCCEEDED, K1, 1),
        ("create#2", cp.StepStatus.SUCCEEDED, K2, 1),
    ]

    before = server.total_requests()
    assert run_create_two(ledger_at(), tool) == result  # a new process: replayed
    assert server.total_requests() == before


# -- unknown outcomes: lookup first, never a blind re-send -------------------


def test_response_lost_after_commit_is_found_by_lookup(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    server.arm(drop_after_commit=1)
    ledger = ledger_at()
    result = run_create_two(ledger, tool)

    assert_one_resource_per_key(server, result)
    assert server.count(K1, "POST") == 1  # not re-sent
    assert server.count(K1, "GET") == 1  # looked up, found
    assert step(ledger, "create").status is cp.StepStatus.SUCCEEDED
    assert step(ledger, "create").attempts == 1


def test_timeout_is_unknown_then_found_by_lookup(
    server: IdempotentServer, ledger_at: LedgerFactory
) -> None:
    server.arm(sleep_after_commit=1, sleep_seconds=1.0)
    started = time.monotonic()
    with make_tool(server.url, timeout=0.3) as impatient:
        result = run_create_two(ledger_at(), impatient)

    assert time.monotonic() - started < 5
    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (1, 1)


def test_500_after_commit_is_unknown_then_found(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    server.arm(fail_after_commit=1)
    result = run_create_two(ledger_at(), tool)

    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (1, 1)


def test_500_before_commit_is_unknown_then_not_found_then_sent_again_with_same_key(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    server.arm(fail_before_commit=1)
    ledger = ledger_at()
    result = run_create_two(ledger, tool)

    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (2, 1)
    first, second = (r["headers"] for r in server.requests(K1) if r["method"] == "POST")
    for name in ("Idempotency-Key", "Crashproof-Intent-Digest"):
        assert first[name] == second[name]
    assert step(ledger, "create").attempts == 2


def test_409_in_flight_is_reconciled_by_lookup_not_by_resending(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    # Another request with this key (say, a previous worker's) is still being processed:
    # the POST gets 409, the first lookup 409 too (retried with backoff), then 200.
    server.seed_in_flight(K1, digest_of(tool, "a"), {"name": "a"}, lookups=1)
    result = run_create_two(ledger_at(), tool)

    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (1, 2)


def test_crash_before_execute_then_lookup_404_executes_once_with_same_key(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    points = cp.CrashPoints(match="after_commit[act_intent:create]")
    with pytest.raises(cp.SimulatedCrash):
        run_create_two(ledger_at(crash_points=points), tool)
    assert server.total_requests() == 0

    result = run_create_two(ledger_at(), tool)
    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "GET"), server.count(K1, "POST")) == (1, 1)
    assert [r["method"] for r in server.requests(K1)] == ["GET", "POST"]
    assert parse_key(server.requests(K1)[1]["headers"]["Idempotency-Key"]) == K1


def test_without_lookup_the_targets_dedupe_makes_resending_safe(
    server: IdempotentServer, ledger_at: LedgerFactory
) -> None:
    server.arm(drop_after_commit=1)
    with HttpTool(server.url, "/resources") as no_lookup:
        result = run_create_two(ledger_at(), no_lookup)

    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (2, 0)


# -- conflicts and review ----------------------------------------------------


def test_key_reused_with_another_intent_freezes_with_both_digests(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    other = "0" * 64
    seeded = server.seed(K1, other, {"name": "someone else"})
    ledger = ledger_at()
    with pytest.raises(cp.RunFrozen) as frozen:
        run_create_two(ledger, tool)

    assert frozen.value.status == "needs_review"
    assert isinstance(frozen.value.cause, cp.ReceiptConflict)
    info = ledger.get_run(RUN)
    assert info.status is cp.RunStatus.NEEDS_REVIEW
    assert info.evidence is not None
    assert info.evidence["operation_id"] == K1
    assert info.evidence["intent_digest"] == digest_of(tool, "a")
    assert info.evidence["receipt"]["intent_digest"] == other
    assert info.evidence["receipt"]["receipt_id"] == seeded["id"]
    assert server.requests(K2) == []  # nothing else executed
    assert server.count(K1, "POST") == 1

    with pytest.raises(cp.RunFrozen):
        run_create_two(ledger_at(), tool)  # stays frozen: a human decides
    assert server.count(K1, "POST") == 1
    assert server.requests(K2) == []
    assert len(server.resources()) == 1


def test_lookup_unavailable_stops_the_run_then_a_later_resume_completes(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    server.arm(drop_after_commit=1, fail_lookups=1000)
    settings = ActSettings(lookup_attempts=2, backoff=0.01)
    with pytest.raises(cp.RunStopped) as stopped:
        run_create_two(ledger_at(act_settings=settings), tool)

    assert ledger_at().get_run(RUN).status is cp.RunStatus.STOPPED  # resumable, no question
    assert "lookup unavailable" in stopped.value.reason
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (1, 2)
    assert server.requests(K2) == []

    server.arm(fail_lookups=0)  # the target recovers
    ledger = ledger_at(act_settings=settings)
    ledger.register(make_workflow(tool))
    result = ledger.resume(RUN)
    assert ledger.get_run(RUN).status is cp.RunStatus.SUCCEEDED
    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (1, 3)


# -- failures the target vouches for -----------------------------------------


def test_4xx_is_permanent_recorded_and_replayed_without_a_request(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    ledger = ledger_at()

    @ledger.workflow("misrouted")
    def misrouted(ctx: cp.Context) -> str:
        try:
            ctx.act("create", tool, body={"name": "a"}, path="/nowhere")
        except cp.ActFailed as exc:
            return f"refused: {exc}"
        return "created"

    outcome = ledger.run(misrouted, run_id=RUN)
    assert outcome.startswith("refused:")
    assert "404" in outcome
    assert server.count(K1, "POST") == 1
    assert server.requests(K1)[0]["path"] == "/nowhere"
    assert server.resources() == []
    assert step(ledger, "create").status is cp.StepStatus.FAILED

    again = ledger_at()
    again.register(misrouted)
    assert again.resume(RUN) == outcome
    assert server.count(K1, "POST") == 1


def test_429_is_retryable_with_the_same_key(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    server.arm(throttle_posts=1)
    ledger = ledger_at()
    result = run_create_two(ledger, tool)

    assert_one_resource_per_key(server, result)
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (2, 0)
    assert step(ledger, "create").attempts == 2


def test_bad_params_are_refused_before_the_intent(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    ledger = ledger_at()

    @ledger.workflow("typo")
    def typo(ctx: cp.Context) -> Any:
        return ctx.act("create", tool, bdy={"name": "a"})

    with pytest.raises(cp.RunFailed, match="unknown params"):
        ledger.run(typo, run_id=RUN)
    assert server.total_requests() == 0


def test_fencing_token_is_sent_and_a_lower_one_is_rejected_as_stale(
    server: IdempotentServer, tool: HttpTool
) -> None:
    def call(key: str, token: int) -> cp.Call:
        params = {"body": {"name": key}}
        return cp.Call(
            run_id=RUN,
            step=key,
            operation_id=f"{RUN}/{key}",
            intent_digest=intent_digest(tool, params, key),
            params=params,
            fencing_token=token,
        )

    receipt = tool.execute(call("new-owner", 5))
    assert receipt.intent_digest == call("new-owner", 5).intent_digest
    assert server.requests(f"{RUN}/new-owner")[0]["headers"]["Fencing-Token"] == "5"
    with pytest.raises(cp.StaleLeaseError):
        tool.execute(call("old-owner", 4))
    assert server.resource(f"{RUN}/old-owner") is None
    assert tool.execute(call("newest", 6)).receipt_id


# -- SIGKILL in every window of the act protocol ------------------------------

# (crash point in the child, server fault armed, lookups expected for the crashed act)
WINDOWS = [
    # no intent journaled: the workflow reaches the act afresh, no lookup
    pytest.param("before_commit[act_intent:{k}]", None, 0, id="before-intent"),
    # intent journaled, nothing sent: lookup 404, then sent once with the same key
    pytest.param("after_commit[act_intent:{k}]", None, 1, id="after-intent"),
    # target committed, connection dropped, killed while journaling "unknown": found
    pytest.param("before_commit[act_unknown:{k}]", "drop_after_commit", 1, id="response-lost"),
    # response received, killed before the receipt commit: found
    pytest.param("before_commit[step_done:{k}]", None, 1, id="receipt-lost"),
]


@pytest.mark.parametrize("key", ["create", "create#2"])
@pytest.mark.parametrize(("template", "fault", "lookups"), WINDOWS)
def test_sigkill_in_each_window_resumes_with_one_resource_and_no_resend(
    server: IdempotentServer,
    ledger_at: LedgerFactory,
    tool: HttpTool,
    tmp_path: Path,
    key: str,
    template: str,
    fault: str | None,
    lookups: int,
) -> None:
    crashed = f"{RUN}/{key}"
    if fault is not None:
        server.arm(**{fault: 1}, key=crashed)
    point = template.format(k=key)
    argv = [sys.executable, str(CHILD), str(tmp_path / "l.db"), server.url, RUN, point]
    returncode = subprocess.run(argv, check=False, timeout=20).returncode
    assert returncode == -signal.SIGKILL
    posts_before = server.count(crashed, "POST")
    sent = not template.startswith(("before_commit[act_intent", "after_commit[act_intent"))
    assert posts_before == (1 if sent else 0)
    assert (server.resource(crashed) is not None) is sent
    journaled = {s.key: s.status for s in ledger_at().get_run(RUN).steps}
    if lookups:  # an intent without a receipt: the act is in flight
        assert journaled[key] is cp.StepStatus.RUNNING
    else:
        assert key not in journaled

    result = run_create_two(ledger_at(), tool)

    assert ledger_at().get_run(RUN).status is cp.RunStatus.SUCCEEDED
    assert_one_resource_per_key(server, result)
    assert server.count(crashed, "GET") == lookups
    assert server.count(crashed, "POST") == 1  # never re-sent once the target had it
    for other in {K1, K2} - {crashed}:
        # A create completed before the crash is re-read once on resume (its receipt is
        # the target's), never re-sent; one completed after the resume is not read.
        reread = 1 if other == K1 else 0
        assert (server.count(other, "POST"), server.count(other, "GET")) == (1, reread)


# -- keys that are not plain ASCII -------------------------------------------


def test_non_ascii_operation_ids_travel_percent_encoded_and_are_found(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    run_id = "rün 1"
    key = "r%C3%BCn%201/create"
    assert wire_key(f"{run_id}/create") == key
    server.arm(drop_after_commit=1)
    result = ledger_at().run(make_workflow(tool), run_id=run_id, names=["a", "b"])

    assert result["bodies"] == EXPECTED_BODIES
    assert (server.count(key, "POST"), server.count(key, "GET")) == (1, 1)
    assert server.requests(key)[0]["headers"]["Idempotency-Key"] == f'"{key}"'


# -- how each answer is read (no server needed: httpx.MockTransport) ----------


def mock_call(tool: HttpTool, token: int | None = None) -> cp.Call:
    params = {"body": {"name": "a"}}
    return cp.Call(
        run_id=RUN,
        step="create",
        operation_id=K1,
        intent_digest=intent_digest(tool, params, "create"),
        params=params,
        fencing_token=token,
    )


def mock_tool(answer: Callable[[httpx.Request], httpx.Response]) -> HttpTool:
    return HttpTool(
        "http://target.invalid",
        "/resources",
        lookup_path="/resources/by-key/{operation_id}",
        transport=httpx.MockTransport(answer),
    )


def respond(status: int, payload: Any = None, **headers: str) -> Callable[..., httpx.Response]:
    return lambda request: httpx.Response(status, json=payload, headers=headers)


OTHER = "f" * 64


@pytest.mark.parametrize(
    ("answer", "token", "raised"),
    [
        (respond(409, {"title": "outstanding"}), None, cp.OutcomeUnknown),
        (respond(422, {"title": "reused"}), None, cp.DriftError),  # no stored digest named
        (respond(412, {"title": "stale"}), 3, cp.StaleLeaseError),
        (respond(412, {"title": "precondition"}), None, cp.PermanentError),
        (respond(429), None, cp.RetryableError),
        (respond(408), None, cp.RetryableError),
        (respond(400), None, cp.PermanentError),
        (respond(403), None, cp.PermanentError),
        (respond(500), None, cp.OutcomeUnknown),
        (respond(502), None, cp.OutcomeUnknown),
        (respond(503), None, cp.OutcomeUnknown),
        (respond(303, Location="/resources/1"), None, cp.OutcomeUnknown),
    ],
)
def test_execute_status_mapping(
    answer: Callable[[httpx.Request], httpx.Response], token: int | None, raised: type
) -> None:
    with mock_tool(answer) as t, pytest.raises(raised):
        t.execute(mock_call(t, token))


def test_execute_transport_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with mock_tool(refuse) as t, pytest.raises(cp.RetryableError):
        t.execute(mock_call(t))  # nothing sent: safe to retry
    with mock_tool(stall) as t, pytest.raises(httpx.ReadTimeout):
        t.execute(mock_call(t))  # sent: unknown, the runtime looks it up


def test_execute_receipts() -> None:
    with mock_tool(respond(201, {"id": 7, "intent_digest": OTHER})) as t:
        receipt = t.execute(mock_call(t))
    assert (receipt.receipt_id, receipt.intent_digest) == ("7", OTHER)  # body digest
    with mock_tool(respond(422, {"id": "r9"}, **{"Crashproof-Intent-Digest": OTHER})) as t:
        conflict = t.execute(mock_call(t))
    assert (conflict.receipt_id, conflict.intent_digest) == ("r9", OTHER)  # header digest
    with mock_tool(respond(200, {"no": "id"})) as t:
        assert t.execute(mock_call(t)).receipt_id == ""  # the runtime freezes it: unnamed
    with mock_tool(respond(422, {"intent_digest": OTHER})) as t:
        assert t.execute(mock_call(t)).receipt_id == f"key:{K1}"


@pytest.mark.parametrize(
    ("answer", "raised"),
    [
        (respond(500), LookupFailed),
        (respond(409), LookupFailed),
        (respond(200, {"no": "id"}), LookupFailed),
        (respond(200, ["not", "an", "object"]), LookupFailed),
        (respond(410), cp.OutcomeUnknown),
    ],
)
def test_lookup_answers_that_are_not_definite(
    answer: Callable[[httpx.Request], httpx.Response], raised: type
) -> None:
    with mock_tool(answer) as t, pytest.raises(raised):
        t.lookup(mock_call(t))


def test_lookup_found_and_not_found() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(200, json={"id": "r1"}, headers={"Crashproof-Intent-Digest": OTHER})

    with mock_tool(answer) as t:
        found = t.lookup(mock_call(t))
    assert found is not None
    assert (found.receipt_id, found.intent_digest) == ("r1", OTHER)
    assert seen == ["/resources/by-key/run%2Fcreate"]
    with mock_tool(respond(404)) as t:
        assert t.lookup(mock_call(t)) is None


# -- bounds --------------------------------------------------------------------


def test_repeated_unknown_outcomes_are_bounded(
    server: IdempotentServer, ledger_at: LedgerFactory, tool: HttpTool
) -> None:
    server.arm(fail_before_commit=10, key=K1)  # every POST 500s, lookup says 404
    with pytest.raises(cp.RunFrozen):
        run_create_two(ledger_at(), tool)
    assert server.count(K1, "POST") <= FAST.retryable_attempts
