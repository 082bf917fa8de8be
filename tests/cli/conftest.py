"""Fixtures for CLI tests: a project directory with workflow modules, and an in-process CLI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crashproof.cli import main

# A user's module, as `crashproof run flows:greet` imports it from the current directory.
# Every function that does work appends its name to calls.log, so tests can count
# what actually ran (as opposed to what was replayed from the ledger).
FLOWS = '''
import pathlib

import crashproof as cp

CALLS = pathlib.Path("calls.log")


def _count(what):
    with CALLS.open("a", encoding="utf-8") as f:
        f.write(what + "\\n")


def compose(name):
    _count("compose")
    return f"hello {name}"


def choose(times):
    _count("choose")
    return cp.Decision(
        {"times": times},
        model="fake-model-1",
        usage={"input_tokens": 10, "output_tokens": 5},
        cost=0.002,
    )


@cp.workflow("greet", version="1")
def greet(ctx, name: str, times: int = 1):
    text = ctx.step("compose", compose, name)
    plan = ctx.decide("choose", choose, times)
    return {"text": text, "times": plan["times"]}


def boom():
    _count("boom")
    raise ValueError("boom [red]not markup[/red]")


@cp.workflow("explode", version="1")
def explode(ctx):
    ctx.step("boom", boom)


def first():
    _count("first")
    return 1


@cp.workflow("flaky", version="1")
def flaky(ctx):
    """Returns a non-JSON value until ready.txt exists (the run stays resumable);
    takes another code path once swerve.txt exists (non-determinism on replay)."""
    value = ctx.step("first", first)
    if pathlib.Path("swerve.txt").exists():
        ctx.step("other", first)
    else:
        ctx.step("second", first)
    if not pathlib.Path("ready.txt").exists():
        return {1, 2}
    return [value]


@cp.workflow("echo", version="1")
def echo(ctx, **kwargs):
    return kwargs


async def acompose(name):
    _count("acompose")
    return f"hello {name}"


@cp.workflow("agreet", version="1")
async def agreet(ctx, name: str):
    """Async: interrupted (a non-JSON result) until ready.txt exists."""
    text = await ctx.step("compose", acompose, name)
    if not pathlib.Path("ready.txt").exists():
        return {1, 2}
    return {"text": text}


def helper():
    return 1
'''

OTHERS = """
import crashproof as cp


@cp.workflow("unrelated", version="1")
def unrelated(ctx):
    return "unrelated"
"""

MODULES = ("flows", "others", "broken", "needs_dep", "plain", "greet_v2", "mail_v2", "mails")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory holding flows.py and others.py; no CRASHPROOF_DB."""
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    (tmp_path / "others.py").write_text(OTHERS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CRASHPROOF_DB", raising=False)
    # The operator identity (review decide) lives in the project, never the user's home.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    monkeypatch.delenv("CRASHPROOF_OPERATOR_KEY", raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # rich tables: no folding in assertions
    # The CLI puts the cwd on sys.path and imports modules by name: undo both.
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``crashproof ARGS...`` in-process; return exit code, stdout and stderr."""

    def invoke(*argv: str) -> Result:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return invoke


@pytest.fixture
def calls(project: Path) -> Callable[[], list[str]]:
    """What the workflow functions actually executed so far, in order."""

    def read() -> list[str]:
        log = project / "calls.log"
        return log.read_text(encoding="utf-8").split() if log.exists() else []

    return read
