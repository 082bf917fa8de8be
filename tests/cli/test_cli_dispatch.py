"""Nothing pending in silence: a message whose HTTP target was down leaves the run
``succeeded (1 undelivered)`` in runs and show (show exits 8), and `crashproof dispatch`
delivers it once the target is up, exactly once."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from crashproof.cli import ExitCode

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

NOTIFY = """
import json
import os
import urllib.request

import crashproof as cp


def post(message):
    body = json.dumps({"id": message.dedupe_key, "text": message.body["text"]}).encode()
    url = f"http://127.0.0.1:{os.environ['CHAT_PORT']}/hook"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback
    with direct.open(urllib.request.Request(url, data=body), timeout=5) as reply:
        reply.read()
    return message.dedupe_key


chat = cp.Outbox("chat", post)


@cp.workflow("notify", version="1")
def notify(ctx):
    ctx.act("tell", chat, text="build is green")
    return "done"
"""


class _Chat(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        _Chat.received.append(self.rfile.read(length))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def chat_port(monkeypatch: pytest.MonkeyPatch) -> int:
    with socket.socket() as s:  # a free port, nothing listening on it yet: the target down
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    monkeypatch.setenv("CHAT_PORT", str(port))
    _Chat.received = []
    return port


@pytest.fixture
def chat_up(chat_port: int) -> Iterator[Callable[[], None]]:
    servers: list[http.server.HTTPServer] = []

    def start() -> None:
        server = http.server.HTTPServer(("127.0.0.1", chat_port), _Chat)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_undelivered_is_marked_until_dispatch_delivers_it_once(
    project: Path, cli: Cli, chat_up: Callable[[], None]
) -> None:
    (project / "notify.py").write_text(NOTIFY, encoding="utf-8")
    ran = cli("run", "notify:notify", "--run-id", "n:1")
    assert ran.code == ExitCode.OK, ran.err  # the run succeeded; the message stays pending
    refused = cli("show", "n:1", "--timeline").out
    assert "outbox_failed" in refused
    assert "Connection refused" in refused  # down, not a bug in the test's delivery

    listed = cli("runs")
    assert "succeeded (1 undelivered)" in listed.out
    assert cli("runs", "--json").json()[0]["undelivered"] == 1
    shown = cli("show", "n:1")
    assert shown.code == ExitCode.UNDELIVERED
    assert "succeeded (1 undelivered)" in shown.out
    as_json = cli("show", "n:1", "--json")
    assert as_json.code == ExitCode.UNDELIVERED
    assert (as_json.json()["status"], as_json.json()["undelivered"]) == ("succeeded", 1)

    still_down = cli("dispatch", "--app", "notify")
    assert still_down.code == ExitCode.UNDELIVERED
    assert "0 message(s) delivered; still undelivered: 1 in n:1" in still_down.err

    chat_up()
    delivered = cli("dispatch", "--app", "notify", "n:1", "--json")
    assert delivered.code == ExitCode.OK, delivered.err
    assert delivered.json() == {"delivered": 1, "undelivered": {}}
    assert len(_Chat.received) == 1
    assert b"build is green" in _Chat.received[0]

    again = cli("dispatch", "--app", "notify")
    assert again.code == ExitCode.OK
    assert len(_Chat.received) == 1  # delivered once, never again
    assert cli("show", "n:1").code == ExitCode.OK
    assert "undelivered" not in cli("runs").out
    assert "undelivered" not in cli("show", "n:1", "--json").json()  # only while pending


def test_dispatch_needs_an_outbox_and_a_known_run(project: Path, cli: Cli, chat_port: int) -> None:
    (project / "notify.py").write_text(NOTIFY, encoding="utf-8")
    assert cli("run", "notify:notify", "--run-id", "n:1").code == ExitCode.OK
    no_tools = cli("dispatch", "--app", "flows")
    assert no_tools.code == ExitCode.USAGE
    assert "no outbox tool" in no_tools.err
    unknown = cli("dispatch", "--app", "notify", "nope:1")
    assert unknown.code == ExitCode.USAGE


def test_the_worker_delivers_pending_messages_by_itself(
    project: Path, cli: Cli, chat_up: Callable[[], None]
) -> None:
    (project / "notify.py").write_text(NOTIFY, encoding="utf-8")
    assert cli("run", "notify:notify", "--run-id", "n:1").code == ExitCode.OK
    assert cli("show", "n:1").code == ExitCode.UNDELIVERED
    chat_up()
    worked = cli("worker", "--app", "notify", "--until-idle")
    assert worked.code == ExitCode.OK, worked.err
    assert '"event": "outbox_dispatched"' in worked.err
    assert len(_Chat.received) == 1
    assert cli("show", "n:1").code == ExitCode.OK
    assert cli("worker", "--app", "notify", "--until-idle").code == ExitCode.OK
    assert len(_Chat.received) == 1  # once
