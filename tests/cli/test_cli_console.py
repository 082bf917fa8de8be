"""`crashproof ui`: what it refuses before serving anything, and what it prints."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")

from crashproof.cli import ExitCode
from crashproof.cli.commands import console

Cli = Callable[..., Any]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str, int]]:
    calls: list[tuple[Any, str, int]] = []
    monkeypatch.setattr(console, "serve", lambda app, host, port: calls.append((app, host, port)))
    return calls


@pytest.fixture
def ledger(cli: Cli, project: Path) -> str:
    db = f"sqlite:///{project / 'runs.db'}"
    assert cli("run", "flows:greet", "--run-id", "g1", "--arg", "name=x", "--db", db).code == 0
    return db


def test_binds_the_loopback_by_default(cli: Cli, ledger: str, served: list[Any]) -> None:
    done = cli("ui", ledger, "--app", "flows")
    assert done.code == ExitCode.OK, done.err
    ((_, host, port),) = served
    assert (host, port) == ("127.0.0.1", console.DEFAULT_PORT)
    assert "http://127.0.0.1:8765/" in done.err
    assert "token" not in done.err


def test_a_non_loopback_bind_without_a_token_is_refused(
    cli: Cli, ledger: str, served: list[Any]
) -> None:
    refused = cli("ui", ledger, "--host", "0.0.0.0")
    assert refused.code == ExitCode.USAGE
    assert "not a loopback address" in refused.err
    assert "--new-token" in refused.err
    assert len(refused.err.strip().splitlines()) == 2  # one error line, one hint line
    assert served == []
    assert cli("ui", ledger, "--host", "0.0.0.0", "--token", " ").code == ExitCode.USAGE


def test_a_non_loopback_bind_with_a_new_token_prints_it(
    cli: Cli, ledger: str, served: list[Any]
) -> None:
    done = cli("ui", ledger, "--host", "0.0.0.0", "--port", "9000", "--new-token")
    assert done.code == ExitCode.OK, done.err
    ((_app, host, port),) = served
    assert (host, port) == ("0.0.0.0", 9000)
    assert "http://0.0.0.0:9000/?token=" in done.err
    assert cli("ui", ledger, "--host", "::", "--token", "t0k3n").code == ExitCode.OK
    assert (
        "http://[::]:8765/?token=t0k3n" in cli("ui", ledger, "--host", "::", "--token", "t0k3n").err
    )


def test_a_path_that_is_not_a_ledger(cli: Cli, project: Path, served: list[Any]) -> None:
    (project / "notes.db").write_text("these are my notes, not a ledger\n" * 100)
    bad = cli("ui", f"sqlite:///{project / 'notes.db'}")
    assert bad.code == ExitCode.LEDGER_UNUSABLE, bad.err
    assert "crashproof: error:" in bad.err
    assert (project / "notes.db").read_text().startswith("these are my notes")
    missing = cli("ui", f"sqlite:///{project / 'missing.db'}")
    assert missing.code == ExitCode.LEDGER_UNUSABLE
    assert not (project / "missing.db").exists()
    assert served == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_real_server_with_a_generated_token(cli: Cli, ledger: str, project: Path) -> None:
    """`crashproof ui` in its own process, through uvicorn: the token it prints opens it."""
    port = _free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "crashproof", "ui", ledger, "--port", str(port), "--new-token"],
        cwd=project,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stderr is not None
        lines = [child.stderr.readline() for _ in range(2)]
        found = re.search(r"\?token=(\S+)", lines[1])
        assert found is not None, lines
        token = found.group(1)
        url = f"http://127.0.0.1:{port}/runs"
        deadline = time.monotonic() + 20
        while True:
            try:
                status, _ = _get(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert status == 401
        assert _get(url, {"Authorization": "Bearer nope"})[0] == 401
        status, body = _get(url, {"Authorization": f"Bearer {token}"})
        assert status == 200
        assert ">g1</a>" in body
    finally:
        child.terminate()
        child.wait(10)
        if child.stderr is not None:
            child.stderr.close()


def test_its_buttons_act_as_the_operator_identity_or_it_says_why_not(
    cli: Cli, ledger: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`crashproof ui` reads the identity `operator init` made, and never makes one."""
    from starlette.testclient import TestClient

    pages: list[str] = []

    def serve(app: Any, host: str, port: int) -> None:  # one page, while the ledger is open
        with TestClient(app, base_url="http://127.0.0.1:8765") as c:
            pages.append(c.get("/run?id=g1").text)

    monkeypatch.setattr(console, "serve", serve)
    bare = cli("ui", ledger)
    assert bare.code == ExitCode.OK, bare.err
    assert "read-only: no operator identity at" in bare.err
    assert not (project / ".config" / "crashproof" / "operator.pem").exists()
    assert "Read-only:" in pages[-1]
    assert cli("operator", "init", "--name", "erin", "--db", ledger).code == ExitCode.OK
    acting = cli("ui", ledger)
    assert "its buttons act as erin" in acting.err
    assert "Buttons act as <strong>erin</strong>" in pages[-1]
