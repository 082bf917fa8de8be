"""Scenarios for ``cp.Shell`` under wall-clock kills (``crashproof verify --mode chaos``):
a real command, SIGKILLed with the run at a random moment, must end with the same
workspace as an uninterrupted run, its effect landed once.

- ``CODEMOD``: a script rewrites 500 files one by one (a codemod: each file gets its
  new name and a marker line appended, some files are added, some deleted), slowly
  enough that most kills land in the middle. A rerun over a half-run's files would append
  the marker twice: the effect count is the most markers any file holds.
- ``PIP_TARGET``: ``pip install --no-index --target vendor`` of a wheel built here by
  hand (no network); ``vendor`` is a declared path (git ignores it). A rerun over a
  half-filled target is refused by pip or leaves it broken; the count is the number of
  ``.dist-info`` directories.
- ``GIT_COMMIT``: ``git add -A && git commit && git gc --prune=now`` in the workspace,
  ``.git`` declared (the command rewrites it). Commit dates are fixed, so the commit id
  is the same in every run; the count is the commits carrying the message.

Run them by hand from the repository root::

    PYTHONPATH=tests/verify crashproof verify shell_scenarios:CODEMOD --mode chaos --trials 50
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.verify import Scenario

FILES = 500
MARKER = "# codemod: renamed old_name\n"
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@localhost",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}

CODEMOD = """\
import os, sys, time
root = sys.argv[1]
names = sorted(os.listdir(os.path.join(root, "src")))
for i, name in enumerate(names):
    path = os.path.join(root, "src", name)
    if i % 50 == 7:
        os.remove(path)
        continue
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("old_name", "new_name") + MARKER)
    if i % 50 == 0:
        with open(os.path.join(root, "src", "added_%03d.py" % i), "w") as f:
            f.write("new_name = %d\\n" % i)
    time.sleep(0.001)
""".replace("MARKER", repr(MARKER))


@dataclass
class Env:
    directory: Path
    root: Path
    workspace: cp.Workspace
    shell: cp.Shell

    def git(self, *args: str) -> str:
        return _git(self.root, *args)


def _git(root: Path, *args: str) -> str:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **GIT_ENV}
    done = subprocess.run(
        ["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _repo(directory: Path, files: int, ignore: str = "") -> Path:
    root = directory / "ws"
    if not root.exists():
        (root / "src").mkdir(parents=True)
        for i in range(files):
            (root / "src" / f"mod_{i:03d}.py").write_text(f"old_name = {i}\nprint(old_name)\n")
        (root / ".gitignore").write_text(ignore)
        _git(root, "init", "-q", "-b", "main")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", "initial")
    return root


def _env(directory: Path, files: int, paths: list[str], ignore: str = "") -> Env:
    root = _repo(directory, files, ignore)
    workspace = cp.Workspace(root)
    return Env(directory, root, workspace, cp.Shell(workspace, paths=paths, timeout=120))


def _fingerprint(env: Env, exclude: list[str] | None = None) -> str:
    return env.workspace.fingerprint(exclude=exclude)


# -- the codemod ----------------------------------------------------------------


def codemod_env(directory: Path) -> Env:
    script = directory / "codemod.py"
    if not script.exists():
        script.write_text(CODEMOD)
    return _env(directory, FILES, [])


def codemod_workflow(env: Env) -> cp.Workflow[Any]:
    @cp.workflow("shell-codemod")
    def flow(ctx: cp.Context) -> dict[str, Any]:
        argv = [
            os.path.abspath(sys.executable),
            "../codemod.py",
            ".",
        ]  # relative: the same intent anywhere
        done = ctx.act("codemod", env.shell, argv=argv)
        return {"exit": done["exit_code"], "changed": done["delta"]["count"]}

    return flow


def codemod_effects(env: Env) -> dict[str, int]:
    most = 0
    for path in (env.root / "src").iterdir():
        most = max(most, path.read_text().count(MARKER))
    return {"verify:shell-codemod/codemod": most} if most else {}


CODEMOD_SCENARIO = Scenario(
    name="shell-codemod",
    workflow_factory=codemod_workflow,
    env_factory=codemod_env,
    fingerprint=_fingerprint,
    effects=codemod_effects,
)

# -- pip install --target -------------------------------------------------------


def build_wheel(directory: Path) -> Path:
    """A tiny pure-Python wheel, written by hand (what ``pip wheel`` would build)."""
    wheel = directory / "tinypkg-1.0-py3-none-any.whl"
    if wheel.exists():
        return wheel
    files = {f"tinypkg/mod_{i:02d}.py": f"VALUE = {i}\n" for i in range(40)}
    files["tinypkg/__init__.py"] = "from .mod_00 import VALUE\n"
    info = "tinypkg-1.0.dist-info"
    files[f"{info}/METADATA"] = "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    temp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(temp, "w") as zf:
        for name, text in files.items():
            zf.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), text)
    temp.replace(wheel)
    return wheel


def pip_env(directory: Path) -> Env:
    build_wheel(directory)
    return _env(directory, 20, ["vendor"], ignore="vendor/\n")


def pip_workflow(env: Env) -> cp.Workflow[Any]:
    @cp.workflow("shell-pip")
    def flow(ctx: cp.Context) -> dict[str, Any]:
        wheel = "../tinypkg-1.0-py3-none-any.whl"  # relative: the same intent anywhere
        argv = [os.path.abspath(sys.executable), "-m", "pip", "install", "--no-index", "--no-deps"]
        argv += ["--no-compile", "--target", "vendor", wheel]
        pip = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
        done = ctx.act("install", env.shell, argv=argv, env=pip)
        return {"exit": done["exit_code"]}

    return flow


# The wheel's path (another per trial) is recorded there; nothing else differs.
_PIP_VARYING = ["vendor/*.dist-info/direct_url.json", "vendor/*.dist-info/RECORD"]


def pip_effects(env: Env) -> dict[str, int]:
    vendor = env.root / "vendor"
    count = len(list(vendor.glob("tinypkg-*.dist-info"))) if vendor.is_dir() else 0
    return {"verify:shell-pip/install": count} if count else {}


PIP_SCENARIO = Scenario(
    name="shell-pip",
    workflow_factory=pip_workflow,
    env_factory=pip_env,
    fingerprint=lambda env: _fingerprint(env, _PIP_VARYING),
    effects=pip_effects,
)

# -- a git operation ------------------------------------------------------------


def git_env(directory: Path) -> Env:
    env = _env(directory, 300, [".git"])
    for i in range(0, 300, 3):  # the agent's uncommitted work
        path = env.root / "src" / f"mod_{i:03d}.py"
        if MARKER not in path.read_text():
            path.write_text(path.read_text() + MARKER)
    return env


def git_workflow(env: Env) -> cp.Workflow[Any]:
    @cp.workflow("shell-git")
    def flow(ctx: cp.Context) -> dict[str, Any]:
        script = "git add -A && git commit -q -m 'codemod: rename' && git gc -q --prune=now"
        done = ctx.act("commit", env.shell, argv=["sh", "-c", script], env=GIT_ENV)
        return {"exit": done["exit_code"]}

    return flow


def git_fingerprint(env: Env) -> str:
    fsck = subprocess.run(
        ["git", "fsck", "--no-dangling", "--no-progress"], cwd=env.root, capture_output=True
    )
    state = [env.workspace.fingerprint(), env.git("rev-parse", "HEAD"), str(fsck.returncode)]
    state.append(env.git("status", "--porcelain"))
    return hashlib.sha256("\n".join(state).encode()).hexdigest()


def git_effects(env: Env) -> dict[str, int]:
    log = env.git("log", "--all", "--format=%s").splitlines()
    count = log.count("codemod: rename")
    return {"verify:shell-git/commit": count} if count else {}


GIT_SCENARIO = Scenario(
    name="shell-git",
    workflow_factory=git_workflow,
    env_factory=git_env,
    fingerprint=git_fingerprint,
    effects=git_effects,
)
