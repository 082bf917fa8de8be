"""The reason a person reads for a stopped run (`crashproof run`, `show`, `show --json`)
when a tool's message puts a long path first and its error last: a real cp.Shell whose
snapshot store cannot be made (a file where a directory of its long path goes, the
kernel's ENOTDIR). The reason keeps the start and the end around " … ", so the errno text
survives; the whole message is in the evidence `show` prints; a control character in
the path is printed as an escape."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crashproof.cli import ExitCode

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="cp.Shell: Linux")

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

SNAP = """
import pathlib

import crashproof as cp

ROOT = pathlib.Path.cwd()
# A file where the store's first directory goes; the path is long, with an ESC in it
# (where the end of the kernel's message, kept in the reason, names it).
STORE = ROOT / "disk" / ("a" * 200) / ("b" * 200 + "\\x1b[2J") / "store"
shell = cp.Shell(cp.Workspace(ROOT / "ws"), store=STORE)


@cp.workflow("snap", version="1")
def snap(ctx):
    return ctx.act("cmd", shell, argv=["true"])
"""

ERRNO = "NotADirectoryError: [Errno 20] Not a directory: '"


@pytest.fixture
def snap(project: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (project / "snap.py").write_text(SNAP, encoding="utf-8")
    (project / "disk").write_text("a file where the store's directory goes\n")
    subprocess.run(["git", "init", "-q", str(project / "ws")], check=True)
    monkeypatch.setenv("COLUMNS", "5000")  # the whole reason on one line, for assertions
    sys.modules.pop("snap", None)
    yield project
    sys.modules.pop("snap", None)  # the CLI imported it by name


def test_the_shown_reason_keeps_the_error_after_a_long_store_path(snap: Path, cli: Cli) -> None:
    stopped = cli("run", "snap:snap", "--run-id", "s")
    assert stopped.code == ExitCode.RUN_INTERRUPTED
    assert ERRNO in stopped.err
    shown = cli("show", "s", "--json").json()
    reason = shown["reason"]
    assert reason.startswith(
        "unavailable:cmd: cp.Shell's snapshot store failed before the command started, "
        "nothing ran in this attempt; free or repair it, then resume (store "
    )
    assert ERRNO in reason  # the why, after the path
    assert " … " in reason  # the path's middle elided
    assert len(reason) < 600  # bounded
    whole = shown["evidence"]["unavailable"]["error"]["message"]
    assert whole.endswith(reason.rpartition(" … ")[2])  # the whole in the evidence
    assert len(whole) > 800
    assert "b" * 200 in whole

    text = cli("show", "s")
    assert text.code == 0
    header = next(line for line in text.out.splitlines() if line.startswith("reason"))
    assert ERRNO in header
    assert "\x1b" not in text.out  # the ESC in the path: written as an escape
    assert "\\x1b[2J" in header
    assert "b" * 200 in text.out  # the whole message: the evidence panel
