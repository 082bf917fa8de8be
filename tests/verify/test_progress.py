"""The demo's progress line (verify/progress.py) and where its closing lines send a
newcomer (verify/demo.py): the output's shape, on a clock the test moves."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from crashproof.verify import demo
from crashproof.verify.progress import ProgressLine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _console(tty: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=tty, width=80, color_system=None), out


def test_a_log_gets_a_plain_line_every_tenth_and_the_time_left() -> None:
    console, out = _console(tty=False)
    clock = Clock()
    line = ProgressLine(console, "cases: SIGKILL, then resume", clock=clock)
    line(1, 2, "no crash (reference)")  # the total grows once the crash points are known
    for done in range(2, 71):
        clock.now += 1.0
        line(done, 70, f"point {done}")
    line.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert "\x1b" not in out.getvalue()
    assert 9 <= len(lines) <= 11, lines
    assert lines[0] == "  1/2 cases: SIGKILL, then resume, about 0 s left"
    # 7 of 70 after 6 s: ~0.86 s a case, 63 left
    assert lines[1] == "  7/70 cases: SIGKILL, then resume, about 54 s left"
    assert all(
        re.fullmatch(r"  \d+/70 cases: SIGKILL, then resume, about \d+ s left", x)
        for x in lines[1:-1]
    )
    assert lines[-1] == "  70/70 cases: SIGKILL, then resume, in 1 min 09 s"


def test_a_terminal_gets_one_line_rewritten_in_place_then_wiped() -> None:
    console, out = _console(tty=True)
    clock = Clock()
    line = ProgressLine(console, "cases", clock=clock)
    for done in range(1, 6):
        clock.now += 30.0
        line(done, 5, "after_commit[act_intent:s3]" + "x" * 200)
    shown = out.getvalue()
    assert "\n" not in shown  # never scrolls
    frames = shown.split("\r")[1:]
    assert len(frames) == 5
    assert (
        frames[0]
        == "1/5 cases, about 2 min 00 s left: after_commit[act_intent:s3]"
        + "x" * (79 - len("1/5 cases, about 2 min 00 s left: after_commit[act_intent:s3]"))
        + "\x1b[K"
    )
    assert all(len(f) <= 79 + len("\x1b[K") for f in frames)  # cut to the width
    line.close()
    assert out.getvalue().endswith("\r\x1b[K")


def test_the_tour_install_line_fits_the_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """From a checkout's .venv (make demo): pip into that venv, editable; elsewhere the
    extra from the registry; with the SDK there, no install line at all."""
    real_find_spec = demo.importlib.util.find_spec
    monkeypatch.setattr(
        demo.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "openai" else real_find_spec(name, *a),
    )
    monkeypatch.chdir(tmp_path)
    assert demo._tour_install() == "pip install 'crashproof[openai]'"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "crashproof"\n')
    (tmp_path / ".venv").mkdir()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    assert demo._tour_install() == ".venv/bin/pip install -e '.[openai]'"
    monkeypatch.undo()
    if real_find_spec("openai") is not None:
        assert demo._tour_install() is None
