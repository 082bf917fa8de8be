"""A model call's request on its run's page and in `crashproof show RUN --step KEY`
(#40), stored by default beside its record: through each SDK's real client and the local
model server, the system and user messages the agent passed, the tool calls of its
history with their arguments, the reply; everything escaped, a policy's secret field
redacted; with ``store_requests=False`` the request is not stored and the page says so;
a request text altered or removed beside its record is refused, on the page and in
``show``, never shown nor a server error."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("openai")

from starlette.testclient import TestClient

import crashproof as cp
from crashproof.cli import ExitCode, main
from crashproof.console import ConsoleConfig, create_app

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))

from apis import APIS, Api
from model_server import ModelServer, Turn

SYSTEM = "You fix tests. <script>alert(1)</script>\x1b[2J"
USER = "fix tests/test_x.py <b>now</b>"
ARGS = {"path": "tests/test_x.py", "password": "hunter2"}  # a secret field: redacted


def _history(api: Api) -> list[Any]:
    """The second turn's history: the user's ask, the model's tool call, its result."""
    if api.name == "chat":
        call = {"id": "c1", "type": "function"}
        call["function"] = {"name": "edit", "arguments": json.dumps(ARGS)}
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "edited"},
        ]
    if api.name == "responses":
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "edit",
                "arguments": json.dumps(ARGS),
            },
            {"type": "function_call_output", "call_id": "c1", "output": "edited"},
        ]
    return [
        {"role": "user", "content": USER},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c1", "name": "edit", "input": ARGS}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "edited"}],
        },
    ]


def _run(root: Path, api: Api, url: str, store_requests: bool) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{root / 'runs.db'}", store_requests=store_requests)
    client = api.client(url, is_async=False)
    policy = cp.Policy("p-1", allow={}, secret_fields=["password"])

    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> str:
        llm = api.bind(ctx, client, name="model")
        history = _history(api)
        extra = {"system": SYSTEM} if api.name == "anthropic" else {}
        llm.create(**api.request(history[:-2], None), **extra)
        llm.create(**api.request(history, None), **extra)
        return "done"

    ledger.run(agent, run_id=f"agent-{api.name}", options=cp.RunOptions(policy=policy))
    return ledger


@pytest.fixture(params=APIS, ids=lambda a: a.name)
def api(request: pytest.FixtureRequest) -> Api:
    return request.param  # type: ignore[no-any-return]


def _world(tmp_path: Path, api: Api, store_requests: bool = True) -> cp.Ledger:
    with ModelServer([Turn("calling edit"), Turn("done: <i>fixed</i>")]) as server:
        return _run(tmp_path, api, server.url, store_requests)


@pytest.fixture
def world(tmp_path: Path, api: Api) -> Iterator[tuple[cp.Ledger, str]]:
    ledger = _world(tmp_path, api)
    yield ledger, f"agent-{api.name}"
    ledger.close()


def _contents(html: str, key: str) -> str:
    found = re.search(rf'<tr class="contents" data-step="{re.escape(key)}">(.*?)</tr>', html, re.S)
    assert found is not None, key
    return found.group(1)


def test_the_run_page_shows_each_calls_request(world: tuple[cp.Ledger, str]) -> None:
    ledger, run_id = world
    app = create_app(ConsoleConfig(ledger=ledger))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        page = client.get(f"/run?id={run_id}")
    assert page.status_code == 200
    turn = _contents(page.text, "model#2")
    assert "fix tests/test_x.py &lt;b&gt;now&lt;/b&gt;" in turn  # the user's message, escaped
    assert "You fix tests. &lt;script&gt;alert(1)&lt;/script&gt;\\x1b[2J" in turn  # the system's
    assert "<script>" not in page.text
    assert "\x1b" not in page.text
    assert "calls <code>edit</code>" in turn  # the history's tool call, with its arguments
    assert "&#34;path&#34;: &#34;tests/test_x.py&#34;" in turn
    assert "hunter2" not in page.text  # the policy's secret field
    assert "[redacted]" in turn
    assert "edited" in turn  # the tool's result
    assert "done: &lt;i&gt;fixed&lt;/i&gt;" in turn  # and the reply
    assert "bound by their digest only" not in turn
    first = _contents(page.text, "model")
    assert "fix tests/test_x.py" in first
    assert "calls <code>edit</code>" not in first


def test_crashproof_show_step_prints_the_request(
    world: tuple[cp.Ledger, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger, run_id = world
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert main(["show", run_id, "--step", "model#2", "--db", ledger.url]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "fix tests/test_x.py <b>now</b>" in out
    assert "You fix tests. <script>alert(1)</script>\\x1b[2J" in out  # control characters escaped
    assert "\x1b" not in out
    assert "calls edit" in out
    assert '"path": "tests/test_x.py"' in out
    assert "hunter2" not in out
    assert "done: <i>fixed</i>" in out
    assert main(["show", run_id, "--step", "model#2", "--db", ledger.url, "--json"]) == ExitCode.OK
    record: dict[str, Any] = json.loads(capsys.readouterr().out)
    prompt = record["prompt"]
    assert prompt["refused"] is None
    texts = [m["text"] for m in prompt["messages"]]
    assert USER in texts
    assert SYSTEM in texts
    calls = [c for m in prompt["messages"] for c in m["tool_calls"]]
    assert calls[0]["name"] == "edit"
    assert calls[0]["arguments"] == {"path": "tests/test_x.py", "password": "[redacted]"}
    assert prompt["other"]["model"] == "m"


def test_store_requests_false_keeps_the_prompt_out(
    tmp_path: Path, api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = _world(tmp_path, api, store_requests=False)
    run_id = f"agent-{api.name}"
    app = create_app(ConsoleConfig(ledger=ledger))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        page = client.get(f"/run?id={run_id}")
    turn = _contents(page.text, "model#2")
    assert "bound by their digest only, not stored" in turn
    assert "fix tests/test_x.py" not in page.text
    capsys.readouterr()
    assert main(["show", run_id, "--step", "model#2", "--db", ledger.url]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "bound by their digest only, not stored" in out
    assert "fix tests/test_x.py" not in out
    ledger.close()


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("UPDATE requests SET text = replace(text, 'fix tests', 'FIX tests')", "does not match"),
        ("DELETE FROM requests", "is missing"),
    ],
)
def test_an_altered_or_missing_request_is_refused(
    world: tuple[cp.Ledger, str], capsys: pytest.CaptureFixture[str], edit: str, reason: str
) -> None:
    ledger, run_id = world
    path = ledger.url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(edit)
        conn.commit()
    app = create_app(ConsoleConfig(ledger=ledger))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        page = client.get(f"/run?id={run_id}")
    assert page.status_code == 200
    turn = _contents(page.text, "model")
    assert reason in turn
    assert "FIX tests" not in page.text
    capsys.readouterr()
    assert main(["show", run_id, "--step", "model", "--db", ledger.url]) == ExitCode.OK
    out = capsys.readouterr().out
    assert reason in " ".join(out.split())
    assert "FIX tests" not in out
