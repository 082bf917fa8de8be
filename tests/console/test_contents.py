"""What the agent said and did, on its run's page and in `crashproof show RUN --step KEY`
(#40): a model call through the real SDK client as a conversation turn with its tool
calls and arguments, an act's params and receipt, Workspace acts as diffs, a failure with
its traceback, and a large value cut in the run's page, whole on the step's page."""

from __future__ import annotations

import json
import re
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

import contextlib

from apis import APIS, Api
from model_server import ModelServer, Turn

SAID = "I will fix the <b>flaky</b> test"
ARGS = {"path": "tests/test_x.py", "why": "flaky"}
BIG = "x" * 10_000


def _run(root: Path, api: Api, url: str) -> cp.Ledger:
    ledger = cp.Ledger(f"sqlite:///{root / 'runs.db'}")
    (root / "ws").mkdir()
    ws = cp.Workspace(root / "ws")
    client = api.client(url, is_async=False)

    def broken() -> None:
        raise ValueError("tests failed: 3 of 9")

    @ledger.workflow("agent", version="1")
    def agent(ctx: cp.Context) -> str:
        llm = api.bind(ctx, client, name="model")
        tool = {"name": "edit", "parameters": {"type": "object", "properties": {}}}
        llm.create(**api.request([{"role": "user", "content": "fix it"}], [tool]))
        ctx.act("write", ws, op="write", path="a.txt", content="one\ntwo\n")
        ctx.act("append", ws, op="append", path="a.txt", text="three\n")
        ctx.act("patch", ws, op="patch", path="a.txt", diff=_diff())
        ctx.step("big", lambda: {"log": BIG})
        with contextlib.suppress(ValueError):
            ctx.step("tests", broken)
        return "done"

    ledger.run(agent, run_id=f"agent-{api.name}")
    return ledger


def _diff() -> str:
    return "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"


@pytest.fixture(params=APIS, ids=lambda a: a.name)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[cp.Ledger, str]]:
    api: Api = request.param
    with ModelServer([Turn(SAID, (("edit", json.dumps(ARGS)),))]) as server:
        ledger = _run(tmp_path, api, server.url)
    yield ledger, f"agent-{api.name}"
    ledger.close()


@pytest.fixture
def client(world: tuple[cp.Ledger, str]) -> Iterator[TestClient]:
    app = create_app(ConsoleConfig(ledger=world[0]))
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        yield c


def _contents(html: str, key: str) -> str:
    found = re.search(rf'<tr class="contents" data-step="{re.escape(key)}">(.*?)</tr>', html, re.S)
    assert found is not None, key
    return found.group(1)


def test_the_run_page_shows_what_each_step_holds(
    world: tuple[cp.Ledger, str], client: TestClient
) -> None:
    run_id = world[1]
    page = client.get(f"/run?id={run_id}")
    assert page.status_code == 200
    turn = _contents(page.text, "model")
    assert "I will fix the &lt;b&gt;flaky&lt;/b&gt; test" in turn  # escaped, never markup
    assert "calls <code>edit</code>" in turn
    assert "&#34;path&#34;: &#34;tests/test_x.py&#34;" in turn  # the arguments, parsed
    assert "tokens" in turn
    written = _contents(page.text, "write")
    assert "+one" in written
    assert "+two" in written
    appended = _contents(page.text, "append")
    assert '<span class="add">+three</span>' in appended
    assert '<span class="ctx"> two</span>' in appended  # the base, rebuilt
    patched = _contents(page.text, "patch")
    assert '<span class="del">-two</span>' in patched
    assert '<span class="add">+TWO</span>' in patched
    assert "&#34;op&#34;: &#34;patch&#34;" in patched  # the act's params
    failed = _contents(page.text, "tests")
    assert "ValueError" in failed
    assert "tests failed: 3 of 9" in failed
    assert "Traceback (most recent call last)" in failed
    assert "raise ValueError(&#34;tests failed: 3 of 9&#34;)" in failed  # the source line
    big = _contents(page.text, "big")
    assert "more characters" in big
    assert big.count("x") < 5_000


def test_a_steps_own_page_shows_it_whole(world: tuple[cp.Ledger, str], client: TestClient) -> None:
    run_id = world[1]
    whole = client.get(f"/run/step?id={run_id}&key=big")
    assert whole.status_code == 200
    assert BIG in whole.text
    assert "more characters" not in whole.text
    missing = client.get(f"/run/step?id={run_id}&key=nope")
    assert missing.status_code == 404
    assert client.get("/run/step?id=nope&key=big").status_code == 404


def test_crashproof_show_step_prints_the_same(
    world: tuple[cp.Ledger, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger, run_id = world
    monkeypatch.setenv("COLUMNS", "200")
    url = ledger.url
    capsys.readouterr()
    assert main(["show", run_id, "--step", "model", "--db", url]) == ExitCode.OK
    out = capsys.readouterr().out
    assert SAID in out
    assert "calls edit" in out
    assert '"path": "tests/test_x.py"' in out
    assert main(["show", run_id, "--step", "tests", "--db", url]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "Traceback (most recent call last)" in out
    assert main(["show", run_id, "--step", "patch", "--db", url, "--json"]) == ExitCode.OK
    record: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert record["params"]["op"] == "patch"
    assert "+TWO" in record["diff"]
    assert record["receipt"]["tool"] == "workspace"
    assert main(["show", run_id, "--step", "nope", "--db", url]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "has no recorded step 'nope'" in err
    assert len(err.splitlines()) == 2
