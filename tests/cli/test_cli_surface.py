"""The CLI's surface: help for everything, exit codes documented, env vars, entry points."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer.main

import crashproof.cli
from crashproof.cli import ExitCode, app
from crashproof.cli.exitcodes import EXIT_CODES_TEXT

Cli = Callable[..., Any]  # the `cli` fixture: (*argv) -> conftest.Result

GROUP: Any = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)


def test_the_expected_commands_exist() -> None:
    assert {"run", "resume", "runs", "show", "demo"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_and_option_has_help(name: str) -> None:
    # sqlite-utils style: a command nobody documented fails the build.
    command = GROUP.commands[name]
    assert (command.help or "").strip(), f"command {name!r} has no help"
    for param in command.params:
        assert getattr(param, "help", None), f"{name}: parameter {param.name!r} has no help"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_renders(cli: Cli, name: str) -> None:
    result = cli(name, "--help")
    assert result.code == ExitCode.OK
    assert f"crashproof {name}" in result.out


def test_root_options_have_help() -> None:
    for param in GROUP.params:
        assert getattr(param, "help", None), f"global option {param.name!r} has no help"


def test_exit_codes_are_documented_in_help_and_docstring(cli: Cli) -> None:
    assert set(EXIT_CODES_TEXT) == set(ExitCode)
    shown = cli("--help")
    assert shown.code == ExitCode.OK
    doc = crashproof.cli.__doc__ or ""
    for code in ExitCode:
        assert f" {int(code)} " in shown.out, code
        assert f"\n{int(code)} " in doc, code
    assert "CRASHPROOF_DB" in shown.out


def test_python_m_crashproof_help_in_a_subprocess(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "crashproof", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout
    assert "resume" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_exit_codes_of_a_real_process(project: Path) -> None:
    def crashproof(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "crashproof", *argv],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    ok = crashproof("run", "flows:greet", "--run-id", "g", "--arg", "name=ada")
    assert ok.returncode == 0, ok.stderr
    assert '"hello ada"' in ok.stdout
    conflict = crashproof("run", "flows:greet", "--run-id", "g", "--arg", "name=bob")
    assert conflict.returncode == ExitCode.CONFLICT
    assert conflict.stderr.startswith("crashproof: error: ")
    assert "Traceback" not in conflict.stderr


def test_crashproof_db_env_var_is_honoured(
    project: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHPROOF_DB", "sqlite:///from-env.db")
    ran = cli("run", "flows:greet", "--run-id", "g", "--arg", "name=ada")
    assert ran.code == ExitCode.OK, ran.err
    assert (project / "from-env.db").exists()
    assert not (project / "crashproof.db").exists()
    assert [r["run_id"] for r in cli("runs", "--json").json()] == ["g"]
    # --db beats the environment.
    other = cli("runs", "--db", "sqlite:///other.db")
    assert other.code == ExitCode.LEDGER_UNUSABLE
    assert "from --db" in other.err
    missing = project / "from-env.db"
    missing.rename(project / "moved.db")
    gone = cli("runs")
    assert gone.code == ExitCode.LEDGER_UNUSABLE
    assert "$CRASHPROOF_DB" in gone.err


def test_absolute_sqlite_url(project: Path, cli: Cli, tmp_path_factory: Any) -> None:
    where = tmp_path_factory.mktemp("ledgers") / "abs.db"
    url = f"sqlite:///{where}"  # an absolute path makes four slashes
    assert url.startswith("sqlite:////")
    assert cli("run", "flows:echo", "--run-id", "x", "--db", url).code == ExitCode.OK
    assert where.exists()
    assert [r["run_id"] for r in cli("runs", "--json", "--db", url).json()] == ["x"]


def test_demo_calls_run_demo_with_a_console(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def run_demo(console: Any, *, workdir: Path | None = None) -> int:
        seen.update(console=console, workdir=workdir)
        console.print("demo ran")
        return 3

    fake = types.ModuleType("crashproof.verify.demo")
    fake.run_demo = run_demo  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "crashproof.verify.demo", fake)
    result = cli("demo", "--workdir", str(tmp_path))
    assert result.code == 3
    assert "demo ran" in result.out
    assert seen["workdir"] == tmp_path
    assert hasattr(seen["console"], "print")


def test_demo_missing_is_a_clear_error(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "crashproof.verify.demo", None)
    result = cli("demo")
    assert result.code == ExitCode.USAGE
    assert result.err.startswith("crashproof: error: the demo is not available")


def test_crashproof_durability_env_var_is_honoured_and_checked(
    project: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHPROOF_DURABILITY", "sometimes")
    bad = cli("run", "flows:greet", "--run-id", "g", "--arg", "name=ada")
    assert bad.code == ExitCode.USAGE
    assert "$CRASHPROOF_DURABILITY is 'sometimes'" in bad.err
    assert "output, full, normal" in bad.err
    assert not (project / "crashproof.db").exists()  # nothing was created
    assert not (project / "calls.log").exists()  # nothing ran
    monkeypatch.setenv("CRASHPROOF_DURABILITY", "full")
    ran = cli("run", "flows:greet", "--run-id", "g", "--arg", "name=ada")
    assert ran.code == ExitCode.OK, ran.err


@pytest.mark.parametrize("name", ["CRASHPROOF_MAX_CLOCK_SKEW", "CRASHPROOF_WINDOW_MARGIN"])
@pytest.mark.parametrize("value", ["-1", "1e9", "soon", "nan"])
def test_a_negative_or_absurd_clock_setting_is_one_line_and_changes_nothing(
    project: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    bad = cli("run", "flows:greet", "--run-id", "g", "--arg", "name=ada")
    assert bad.code == ExitCode.USAGE
    assert f"${name} is {value!r}, not a number of seconds" in bad.err
    assert "Traceback" not in bad.err
    assert not (project / "crashproof.db").exists()  # nothing was created
    assert not (project / "calls.log").exists()  # nothing ran
    monkeypatch.setenv(name, "30")
    assert cli("run", "flows:greet", "--run-id", "g", "--arg", "name=ada").code == ExitCode.OK


def test_the_demo_keeps_its_key_to_itself(tmp_path: Path) -> None:
    """#26 first contact: without a key configured, the real demo (child processes and
    all) signs with a throwaway key it says it uses and removes; nothing is written to
    the user's configuration directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRASHPROOF_KEY")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"))
    done = subprocess.run(
        [sys.executable, "-m", "crashproof", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "throwaway key" in done.stderr
    assert "DIVERGED 0" in done.stdout
    # #43: not a terminal, so its progress comes as plain lines, a count and the time left
    out = done.stdout
    assert "\r" not in out
    ticks = re.findall(r"^  (\d+)/(\d+) cases: SIGKILL, then resume, about .+ left$", out, re.M)
    assert len(ticks) >= 5, out[:3000]
    assert re.search(r"^  (\d+)/\1 cases: SIGKILL, then resume, in .+ s$", out, re.M)
    assert re.search(r"^  (\d+)/\1 crashes during recovery, then resume, in .+ s$", out, re.M)
    # and it ends with a short summary and where to go on
    summary = out[out.index("In short") :]
    assert len(summary.splitlines()) <= 14, summary
    assert re.search(r"naive executor +diverged after \d+ of 28 crashes", summary)
    assert re.search(r"crashproof +all SAME after 68 SIGKILLs, \d+ crashes during", summary)
    assert "30-second tour in README.md" in summary
    assert "crashproof verify MODULE:SCENARIO" in summary
    assert not (tmp_path / "config" / "crashproof").exists()
    used = re.search(r"throwaway key \((.+?), removed at the end\)", done.stderr)
    assert used is not None
    assert not Path(used.group(1)).exists()


def test_version_prints_the_package_version(cli: Cli) -> None:
    from crashproof._version import __version__

    shown = cli("--version")
    assert shown.code == 0
    assert shown.out.startswith(f"crashproof {__version__} (Python ")


def test_without_the_native_modules_the_cli_runs_and_seals_in_python(tmp_path: Path) -> None:
    """What the pure wheel installs (no _seal, no _sigbus: setup.py's default): the CLI
    starts (run_cli goes on without its SIGBUS message), a ledger seals its records in
    Python, and `crashproof runs` verifies and lists them."""
    code = (
        "import sys\n"
        "sys.modules['crashproof.integrity._seal'] = None\n"  # import raises ImportError
        "sys.modules['crashproof.cli._sigbus'] = None\n"
        "import crashproof as cp\n"
        "from crashproof.integrity import seal\n"
        "if seal.NATIVE: raise SystemExit('the native seal was imported')\n"
        f"ledger = cp.Ledger('sqlite:///{tmp_path}/runs.db')\n"
        "flow = ledger.workflow('pure', version='1')(lambda ctx: ctx.step('one', int, '7'))\n"
        "if ledger.run(flow, run_id='pure-1') != 7: raise SystemExit('wrong result')\n"
        "ledger.close()\n"
        f"sys.argv = ['crashproof', 'runs', '--db', 'sqlite:///{tmp_path}/runs.db']\n"
        "from crashproof.cli import run_cli\n"
        "run_cli()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "pure-1" in done.stdout


def test_python_m_crashproof_version_is_the_installed_metadata() -> None:
    """pyproject.toml reads its version from _version.py: what pip recorded, what
    ``crashproof.__version__`` says and what ``python -m crashproof --version`` prints agree."""
    import importlib.metadata

    import crashproof

    installed = importlib.metadata.version("crashproof")
    assert crashproof.__version__ == installed
    done = subprocess.run(
        [sys.executable, "-m", "crashproof", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"crashproof {installed} (Python {platform.python_version()})\n"
