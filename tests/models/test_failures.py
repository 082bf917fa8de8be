"""Model failures through the real SDKs: transient ones (429 with Retry-After, 500, a
connection dropped mid-stream or mid-body, an answer slower than the client's timeout)
are retried with every attempt journaled, an outage of any length stops the run
resumable and a later resume ends with one PR; a 400 is the SDK's own exception, which
the workflow catches, the same on replay; a crash mid-stream records nothing and the
call is made again once; a failed run retried under its id duplicates nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

import anthropic
import openai
import pytest
from apis import FAST, Api
from model_server import Fault, ModelServer, Turn

import crashproof as cp


def _one_call(ledger: cp.Ledger, api: Api, client: Any, stream: bool) -> cp.Workflow[Any]:
    @ledger.workflow("one", version="1")
    def one(ctx: cp.Context) -> str:
        llm = api.bind(ctx, client, options=FAST)
        kw = {"on_event": lambda e: None} if stream else {}
        return api.text(llm.create(**api.request([{"role": "user", "content": "x"}]), **kw))

    return one


FAULTS = {
    "429": (Fault(status=429, retry_after="0"), False),
    "500": (Fault(status=500), False),
    "drop-stream": (Fault(drop=True), True),
    "drop-body": (Fault(drop=True), False),
    "slow": (Fault(slow=1.0), False),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_transient_error_is_retried_and_each_attempt_journaled(api: Api, fault: str) -> None:
    item, stream = FAULTS[fault]
    with ModelServer([item, Turn("ok")]) as server, cp.Ledger("memory://") as ledger:
        client = api.client(server.url, is_async=False, timeout=0.5)
        text = ledger.run(_one_call(ledger, api, client, stream), run_id="t")
        info = ledger.get_run("t")
    assert text.startswith("ok [")
    assert server.count == 2  # the SDK's own retries are off: both attempts are ours
    assert [(s.kind.value, s.status.value, s.attempts) for s in info.steps] == [
        ("decide", "succeeded", 2)
    ]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_bad_request_fails_the_decision_and_the_workflow_catches_it(
    api: Api, is_async: bool, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    errors = (openai.BadRequestError, anthropic.BadRequestError)
    with ModelServer([Fault(status=400)]) as server:
        client = api.client(server.url, is_async=is_async)

        def register(ledger: cp.Ledger) -> cp.Workflow[Any]:
            if is_async:

                async def caught_async(ctx: cp.AsyncContext) -> str:
                    llm = api.bind(ctx, client, options=FAST)
                    try:
                        await llm.create(**api.request([{"role": "user", "content": "x"}]))
                    except errors as exc:
                        return f"caught {type(exc).__name__}"
                    return "not caught"

                return ledger.workflow("c", version="1")(caught_async)

            def caught(ctx: cp.Context) -> str:
                llm = api.bind(ctx, client, options=FAST)
                try:
                    llm.create(**api.request([{"role": "user", "content": "x"}]))
                except errors as exc:
                    return f"caught {type(exc).__name__}"
                return "not caught"

            return ledger.workflow("c", version="1")(caught)

        key = {"chat": "chat", "responses": "response", "anthropic": "message"}[api.name]
        crash = cp.CrashPoints(match=f"after_commit[step_done:{key}]")
        with cp.Ledger(url, crash_points=crash) as ledger:
            wf = register(ledger)
            start = (
                (lambda: asyncio.run(ledger.run_async(wf, run_id="c")))
                if is_async
                else (lambda: ledger.run(wf, run_id="c"))
            )
            with pytest.raises(cp.SimulatedCrash):
                start()
        with cp.Ledger(url) as ledger:  # replayed: the same exception type, no request
            register(ledger)
            got = asyncio.run(ledger.resume_async("c")) if is_async else ledger.resume("c")
        assert server.count == 1
    assert got == "caught BadRequestError"


def test_a_crash_mid_stream_records_nothing_and_asks_again_once(api: Api, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    seen: list[Any] = []

    def crash_on_second(event: Any) -> None:
        seen.append(event)
        if len(seen) == 2:
            raise cp.SimulatedCrash("mid-stream")

    with ModelServer([Turn("first"), Turn("second")]) as server:
        client = api.client(server.url, is_async=False)

        def register(ledger: cp.Ledger, on_event: Any) -> cp.Workflow[Any]:
            @ledger.workflow("s", version="1")
            def streamed(ctx: cp.Context) -> str:
                llm = api.bind(ctx, client, options=FAST)
                request = api.request([{"role": "user", "content": "x"}])
                return api.text(llm.create(**request, on_event=on_event))

            return streamed

        with cp.Ledger(url) as ledger:
            with pytest.raises(cp.SimulatedCrash):
                ledger.run(register(ledger, crash_on_second), run_id="s")
            assert ledger.get_run("s").steps == ()  # nothing of the stream was recorded
        with cp.Ledger(url) as ledger:
            register(ledger, seen.append)
            text = ledger.resume("s")
        assert server.count == 2
    assert text.startswith("second [")


class Forge(cp.Tool):
    """Opens pull requests, deduped by operation id, looked up by it."""

    name: ClassVar[str] = "forge"
    version: ClassVar[str] = "1"

    def __init__(self) -> None:
        self.prs: dict[str, str] = {}

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.prs.setdefault(call.operation_id, call.params["title"])
        return cp.Receipt(call.operation_id, {"pr": len(self.prs)}, call.intent_digest)

    def lookup(self, call: cp.Call) -> cp.Receipt | None:
        if call.operation_id not in self.prs:
            return None
        return cp.Receipt(call.operation_id, {"pr": len(self.prs)}, call.intent_digest)


def _pr_agent(ledger: cp.Ledger, client: Any, forge: Forge, after: Any) -> cp.Workflow[Any]:
    api = Api("chat")
    two = cp.StepOptions(retry=cp.RetryPolicy(attempts=2, backoff=0.01, retry_on=(cp.Unavailable,)))

    @ledger.workflow("pr", version="1")
    def agent(ctx: cp.Context) -> str:
        llm = cp.models.openai_chat(ctx, client, options=two)
        messages: list[Any] = [{"role": "user", "content": "open a PR"}]
        while True:
            reply = llm.create(**api.request(messages))
            messages += llm.reply_messages(reply)
            results = llm.run_tools(reply, {"open_pr": forge})
            if not results:
                break
            messages += results
        ctx.step("after", after)
        return api.text(reply)

    return agent


def test_an_outage_of_any_length_then_resume_ends_with_one_pr(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    forge = Forge()
    script = [Turn("pr", (("open_pr", '{"title": "t"}'),)), *[Fault(status=503)] * 6, Turn("ok")]
    with ModelServer(script) as server:
        client = Api("chat").client(server.url, is_async=False)
        stops = 0
        with cp.Ledger(url) as ledger:
            wf = _pr_agent(ledger, client, forge, lambda: None)
            try:
                ledger.run(wf, run_id="o")
            except cp.RunStopped:
                stops += 1
            while ledger.get_run("o").status is cp.RunStatus.STOPPED:
                assert "unavailable" in str(ledger.get_run("o").reason)
                try:
                    ledger.resume("o")
                except cp.RunStopped:
                    stops += 1
            info = ledger.get_run("o")
        assert server.count == 1 + 6 + 1
    assert stops == 3  # two attempts per drive: three drives stopped by the outage
    assert info.status is cp.RunStatus.SUCCEEDED
    assert forge.prs == {"o/chat/0:open_pr": "t"}


def test_a_retry_after_longer_than_the_policy_stops_at_once(tmp_path: Path) -> None:
    with (
        ModelServer([Fault(status=429, retry_after="3600"), Turn("ok")]) as server,
        cp.Ledger("memory://") as ledger,
    ):
        client = Api("chat").client(server.url, is_async=False)
        with pytest.raises(cp.RunStopped, match="3600"):
            ledger.run(_one_call(ledger, Api("chat"), client, False), run_id="w")
        assert server.count == 1
        assert ledger.get_run("w").status is cp.RunStatus.STOPPED


def test_a_failed_run_retried_under_its_id_duplicates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    forge = Forge()
    flaky = {"fail": True}

    def after() -> None:
        if flaky.pop("fail", False):
            raise RuntimeError("the tests failed")

    with ModelServer([Turn("pr", (("open_pr", '{"title": "t"}'),)), Turn("ok")]) as server:
        client = Api("chat").client(server.url, is_async=False)
        with cp.Ledger(url) as ledger:
            wf = _pr_agent(ledger, client, forge, after)
            with pytest.raises(cp.RunFailed):
                ledger.run(wf, run_id="f")
            text = ledger.retry("f", by="test")
            info = ledger.get_run("f")
        assert server.count == 2  # neither decision asked again
    assert text.startswith("ok [")
    assert info.status is cp.RunStatus.SUCCEEDED
    assert forge.prs == {"f/chat/0:open_pr": "t"}


class Pager(cp.Tool):
    """Pages on-call; cannot look a page up, and its reply is lost once (unknown)."""

    name: ClassVar[str] = "pager"
    version: ClassVar[str] = "1"
    supports_lookup: ClassVar[bool] = False
    on_unknown = cp.OnUnknown.AT_MOST_ONCE  # better a missing page than two

    def __init__(self) -> None:
        self.sent: list[str] = []

    def execute(self, call: cp.Call) -> cp.Receipt:
        self.sent.append(call.operation_id)
        raise TimeoutError("the pager did not answer")


@pytest.mark.parametrize("is_async", [False, True])
def test_an_act_settled_as_not_done_is_told_to_the_model(is_async: bool) -> None:
    pager, api = Pager(), Api("chat")
    script = [Turn("page", (("page", '{"who": "ops"}'),)), Turn("ok")]
    with ModelServer(script) as server, cp.Ledger("memory://") as ledger:
        client = api.client(server.url, is_async=is_async)

        async def aflow(ctx: cp.AsyncContext) -> str:
            llm = cp.models.openai_chat(ctx, client)
            messages: list[Any] = [{"role": "user", "content": "page ops"}]
            reply = await llm.create(**api.request(messages))
            messages += llm.reply_messages(reply)
            messages += await llm.run_tools(reply, {"page": pager})
            return api.text(await llm.create(**api.request(messages)))

        def flow(ctx: cp.Context) -> str:
            llm = cp.models.openai_chat(ctx, client)
            messages: list[Any] = [{"role": "user", "content": "page ops"}]
            reply = llm.create(**api.request(messages))
            messages += llm.reply_messages(reply)
            messages += llm.run_tools(reply, {"page": pager})
            return api.text(llm.create(**api.request(messages)))

        wf = ledger.workflow("page", version="1")(aflow if is_async else flow)
        run = (
            asyncio.run(ledger.run_async(wf, run_id="p"))
            if is_async
            else ledger.run(wf, run_id="p")
        )
        assert run.startswith("ok [")
        told = json.dumps(server.requests[-1]["body"]["messages"][-1])
        assert "not done" in told
        assert pager.sent == ["p/chat/0:page"]  # once, never again
        step = next(s for s in ledger.get_run("p").steps if s.kind.value == "act")
        assert step.failure == "not_done"
