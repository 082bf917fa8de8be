"""`crashproof ui`: what it refuses before serving anything, and what it prints."""

from __future__ import annotations

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
