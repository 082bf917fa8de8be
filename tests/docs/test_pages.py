"""Every code block of README.md and docs/**/*.md runs in CI, as a reader would run it
(the rules: pages.py). One test per page with something to run: its blocks in order, in
a child process with a fresh working directory and HOME, the signing key made as the
README says (``crashproof keygen --default``), and the ``openai`` and ``anthropic``
SDKs pointed by their own environment variables at a local server speaking their wire
protocols (tests/models/model_server.py, answering by the conversation's position).
Every ``crashproof`` command in a shell block, run or not, must parse against the real
command tree."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import typer
from typer import TyperException

from crashproof.cli.app import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # examples.*

from model_server import ModelServer, Turn
from pages import ROOT, SHELLS, Block, blocks, model_script, pages

RUNNER = Path(__file__).with_name("run_page.py")
BIN = Path(sys.executable).parent
# The default script: a text answer at every position, so an agent loop ends at once.
DEFAULT = [Turn(text="done")] * 16


def _runs(block: Block) -> bool:
    return block.lang == "python" or (block.lang in SHELLS and block.not_run is None)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# Pages whose blocks do not run yet (names the reader must supply): each fails today and
# is expected to; a page that starts to pass fails the suite until it leaves this list.
PENDING: set[str] = set()
RUNNABLE = [
    pytest.param(page, marks=pytest.mark.xfail(strict=True, reason="blocks not runnable yet"))
    if _name(page) in PENDING
    else page
    for page in pages()
    if any(_runs(b) for b in blocks(page))
]


@pytest.fixture(scope="session")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The key ``crashproof keygen --default`` makes, as a reader makes it, once."""
    home = tmp_path_factory.mktemp("keyhome")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRASHPROOF_")}
    subprocess.run(
        [str(BIN / "crashproof"), "keygen", "--default"],
        env=dict(env, HOME=str(home)),
        check=True,
        capture_output=True,
    )
    return home / ".config" / "crashproof" / "key"


def _run_page(page: Path, key_file: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """One page's blocks in a child process, its own model server, directory and HOME."""
    home, work = tmp / "home", tmp / "work"
    (home / ".config" / "crashproof").mkdir(parents=True)
    work.mkdir()
    shutil.copy2(key_file, home / ".config" / "crashproof" / "key")
    script = model_script(page)
    turns = (
        DEFAULT
        if script is None
        else [Turn(t["text"], tuple(map(tuple, t.get("calls", ())))) for t in script]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRASHPROOF_")}
    with ModelServer(turns, by_turn=True) as server:
        env.update(
            HOME=str(home),
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONPATH=str(ROOT),
            OPENAI_BASE_URL=f"{server.url}/v1",
            OPENAI_API_KEY="local",
            ANTHROPIC_BASE_URL=server.url,
            ANTHROPIC_API_KEY="local",
            OPENAI_AGENTS_DISABLE_TRACING="1",  # no export to OpenAI from a test
        )
        return subprocess.run(
            [sys.executable, str(RUNNER), str(page)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
        )


@pytest.fixture(scope="session")
def page_runs(
    request: pytest.FixtureRequest, key_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[Path, subprocess.CompletedProcess[str]]:
    """Every selected page run at once, as many at a time as there are cores: the pages
    are independent, and most of a page's time is its children starting up."""
    selected = [
        item.callspec.params["page"]
        for item in request.session.items
        if item.originalname == "test_the_page_runs"  # type: ignore[attr-defined]
    ]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        futures = {
            page: pool.submit(_run_page, page, key_file, tmp_path_factory.mktemp("page"))
            for page in selected
        }
        return {page: future.result() for page, future in futures.items()}


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_the_page_runs(page: Path, page_runs: dict[Path, subprocess.CompletedProcess[str]]) -> None:
    done = page_runs[page]
    assert done.returncode == 0, done.stderr[-6000:]


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def _commands(block: Block) -> list[list[str]]:
    """The ``crashproof`` command lines of a shell block (continuation lines joined),
    each cut at the first shell operator (``||``, ``&&``, ``;``, ``|``, a redirection)."""
    found = []
    for line in block.code.replace("\\\n", " ").splitlines():
        words = _words(line)
        for start, word in enumerate(words):
            if word == "crashproof" and (start == 0 or set(words[start - 1]) <= set("|&;(")):
                rest = words[start + 1 :]
                ends = [i for i, w in enumerate(rest) if w and set(w) <= set("|&;<>()")]
                found.append(rest[: ends[0]] if ends else rest)
    return found


def _parse(command: Any, args: list[str]) -> None:
    """Parses ``args`` down the command tree as the CLI would, running nothing (typer
    carries its own copy of click: its errors are TyperExceptions, its Exit typer's)."""
    try:
        ctx = command.make_context("crashproof", list(args))
    except typer.Exit:  # --help, --version
        return
    if hasattr(command, "resolve_command"):  # a group
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if rest:
            _, sub, remaining = command.resolve_command(ctx, rest)
            _parse(sub, remaining)


@pytest.mark.parametrize("page", pages(), ids=_name)
def test_every_crashproof_command_parses(page: Path) -> None:
    tree = typer.main.get_command(app)
    for block in blocks(page):
        if block.lang not in SHELLS:
            continue
        for args in _commands(block):
            where = f"{_name(page)}:{block.line}: crashproof {shlex.join(args)}"
            try:
                _parse(tree, args)
            except TyperException as exc:
                pytest.fail(f"{where}: {exc}")
            for target in _shipped_targets(args):
                module, _, attribute = target.partition(":")
                if not hasattr(importlib.import_module(module), attribute):
                    pytest.fail(f"{where}: {module} has no attribute {attribute!r}")


def _shipped_targets(args: list[str]) -> list[str]:
    """The ``MODULE:ATTRIBUTE`` arguments naming a module this repository ships
    (``examples.patch_task:SCENARIO``): the page's reader has them, so they must exist."""
    return [a for a in args if re.fullmatch(r"examples(\.\w+)+:\w+", a)]
