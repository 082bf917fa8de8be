"""A small code agent, and the scenario that proves its recovery.

The agent plans with a (scripted, local) model, edits two files in a git working tree
through a ``cp.Workspace`` and checks them; through ``cp.Shell`` it installs the app's
dependency from a wheel held locally (``pip install --no-index --target vendor``),
formats the edited code (``ruff format``) and runs the app's tests (``python -m
unittest``): ``workspace`` commands, so a crash mid-way puts the workspace back as the
command found it and the command runs again. It migrates the app's SQLite schema with
``crashproof.tools.migrations`` (each file and its receipt row in one transaction, so
never applied twice), asks the model for a commit message, commits and creates a branch
with ``GitTool`` (the commit carries its operation id as a trailer, so it can be looked
up), opens a pull request on a local HTTP forge and posts a notification there, both
through ``HttpTool`` (deduplicated by ``Idempotency-Key``, looked up by key).

Verify it from the repository root::

    crashproof verify examples.code_agent:SCENARIO
    crashproof verify examples.code_agent:SCENARIO --mode subprocess --max-points 20

The fingerprint covers the working tree (the vendored package too), the tree git holds
at HEAD and on the agent's branch, the app database and the forge's records; effects are
counted from git's own history (operation trailers, the branch ref), the migrations' own
log table and the forge's own records.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import crashproof as cp
from crashproof.tools.git import OPERATION_TRAILER, GitTool
from crashproof.tools.http import HttpTool
from crashproof.tools.migrations import Migrations
from crashproof.tools.shell import Shell
from crashproof.verify import Scenario

from ._forge import Forge

RUN_ID = "example:code-agent"
TASK = "greet() should greet the user by name; document it"

GREET_PY = 'def greet() -> str:\n    return "Hello!"\n'
README = "# greeter\n\nA friendly module.\n"
# The app's test, run by the agent; it checks greet() against the vendored dependency's
# template (so it needs the install first). Not formatted yet (its quotes): the agent's
# formatter rewrites it, and the commit carries it so.
TEST_GREET_PY = """import unittest

from greetlib import BY_NAME

from greet import greet


class GreetTest(unittest.TestCase):
    def test_greets_by_name(self) -> None:
        self.assertEqual(greet('Ada'), BY_NAME.format(name='Ada'))
"""
GITIGNORE = "vendor/\n__pycache__/\n"
# The dependency: a wheel built here, at set-up (no index, no network).
WHEEL = "greetlib-1.0-py3-none-any.whl"
WHEEL_FILES = {
    "greetlib.py": 'BY_NAME = "Hello, {name}!"\n',
    "greetlib-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: greetlib\nVersion: 1.0\n",
    "greetlib-1.0.dist-info/WHEEL": (
        "Wheel-Version: 1.0\nGenerator: code_agent\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ),
}
# The app's schema, migrated by the agent (a directory of files: one here); each file logs
# itself, so one applied twice would log twice (the effect count).
MIGRATIONS = {
    "0001_greetings.sql": (
        "CREATE TABLE schema_log (name TEXT NOT NULL);\n"
        "CREATE TABLE greetings (name TEXT PRIMARY KEY, template TEXT NOT NULL);\n"
        "INSERT INTO greetings VALUES ('by-name', 'Hello, {name}!');\n"
        "INSERT INTO schema_log VALUES ('0001_greetings.sql');\n"
    ),
}
# What the scripted model answers, per decision key.
SCRIPT: dict[str, Any] = {
    "plan": {
        "title": "Greet users by name",
        "branch": "agent/greet-by-name",
        "edits": [
            {
                "op": "patch",
                "path": "greet.py",
                "diff": (
                    "--- a/greet.py\n+++ b/greet.py\n@@ -1,2 +1,2 @@\n"
                    "-def greet() -> str:\n"
                    '-    return "Hello!"\n'
                    "+def greet(name: str) -> str:\n"
                    "+    return f'Hello, {name}!'\n"  # the formatter's double quotes later
                ),
            },
            {"op": "append", "path": "README.md", "text": "\n`greet(name)` greets by name.\n"},
        ],
    },
    "commit-message": "Greet users by name\n\ngreet() now takes the user's name.",
}


class ScriptedModel:
    """A local model: answers from SCRIPT, every call logged to a file."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def __call__(self, key: str, prompt: str) -> cp.Decision:
        if self.log.with_name(DOWN).exists():  # out: never answered, so never logged
            raise cp.Unavailable("503 Service Unavailable: the scripted model is down")
        with self.log.open("a", encoding="utf-8") as f:
            f.write(key + "\n")
        return cp.Decision(SCRIPT[key], model="scripted-local", usage={"total_tokens": 50})

    def calls(self) -> dict[str, int]:
        return dict(Counter(self.log.read_text().split())) if self.log.exists() else {}


DOWN = "model.down"  # while this file exists in the environment, the model is out


def outage(directory: Path, down: bool) -> None:
    """``crashproof verify --mode chaos --faults outage``: the model down (a 503) or back."""
    flag = directory / DOWN
    if down:
        flag.touch()
    else:
        flag.unlink(missing_ok=True)


@dataclass
class Env:
    repo: Path
    workspace: cp.Workspace
    git: GitTool
    forge: Forge
    http: httpx.Client
    pulls: HttpTool
    notify: HttpTool
    model: ScriptedModel
    shell: Shell  # the dependency install, the formatter, the tests
    database: Path  # the app's SQLite database, migrated through the SQL tool
    migrations: Path

    def close(self) -> None:
        self.http.close()
        self.forge.stop()

    def git_out(self, *args: str) -> str:
        return _git(self.repo, *args)


def _git(repo: Path, *args: str) -> str:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    }
    identity = ["-c", "user.name=seed", "-c", "user.email=seed@localhost"]
    done = subprocess.run(
        ["git", *identity, *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def make_env(directory: Path) -> Env:
    """A git repository with two files and a forge; after a crash, the ones left there."""
    repo = directory / "repo"
    if not repo.exists():
        repo.mkdir()
        (repo / "greet.py").write_text(GREET_PY)
        (repo / "README.md").write_text(README)
        (repo / "test_greet.py").write_text(TEST_GREET_PY)
        (repo / ".gitignore").write_text(GITIGNORE)
        _git(repo, "init", "-q", "-b", "main")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "Initial commit")
    _build_wheel(directory / "wheels" / WHEEL)
    migrations = directory / "migrations"
    migrations.mkdir(exist_ok=True)
    for name, text in MIGRATIONS.items():
        (migrations / name).write_text(text)
    forge = Forge(directory / "forge.json").start()
    forge.ensure_repository("greeter", head=_git(repo, "rev-parse", "main"))
    # Plain HTTP on the loopback: no TLS, so no CA bundle to load for every environment.
    http = httpx.Client(verify=False, timeout=10.0)
    lookup = "/by-key/{operation_id}"
    workspace = cp.Workspace(repo)
    return Env(
        repo=repo,
        workspace=workspace,
        git=GitTool(repo),
        forge=forge,
        http=http,
        pulls=HttpTool(
            forge.url,
            "/repos/greeter/pulls",
            lookup_path=lookup,
            client=http,
            observe_path="/repos/greeter",  # the forge's repository id and head
        ),
        notify=HttpTool(forge.url, "/notifications", lookup_path=lookup, client=http),
        model=ScriptedModel(directory / "model.log"),
        # The same Workspace instance: what a command leaves is what the next act observes.
        shell=Shell(workspace, env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=120),
        database=directory / "app.db",
        migrations=migrations,
    )


def _build_wheel(target: Path) -> None:
    """A pure wheel of one module, the same bytes every time (fixed zip dates)."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    files = dict(WHEEL_FILES)
    record = [f"{name},{_record_hash(text)},{len(text.encode())}" for name, text in files.items()]
    files["greetlib-1.0.dist-info/RECORD"] = "\n".join([*record, "greetlib-1.0.dist-info/RECORD,,"])
    temp = target.with_name(target.name + ".tmp")
    with zipfile.ZipFile(temp, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), text)
    os.replace(temp, target)


def _record_hash(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def commands() -> list[tuple[str, dict[str, Any]]]:
    """The agent's commands, as (act key, ``cp.Shell`` params): the install from the local
    wheel into ``vendor`` (a declared path: snapshotted whole, though git ignores it), the
    formatter over the workspace (git's ignore rules apply: not ``vendor``), then the
    tests with the vendored package.

    The formatter rewrites the agent's own edit (``greet.py``): on resume, that edit's
    receipt is superseded by the command's, not drifted (docs/how-to/shell.md)."""
    python = sys.executable
    install = [python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    install += ["--no-compile", "--disable-pip-version-check", "--target", "vendor"]
    return [
        ("install", {"argv": [*install, f"../wheels/{WHEEL}"], "paths": ["vendor"]}),
        ("format", {"argv": [python, "-m", "ruff", "format", "--isolated", "--no-cache", "."]}),
        ("tests", {"argv": [python, "-m", "unittest", "-q"], "env": {"PYTHONPATH": "vendor"}}),
    ]


def report(results: dict[str, dict[str, Any]]) -> str:
    """What the commands found, for the pull request (a failed one stops the agent)."""
    for key, result in results.items():
        if result["exit_code"] != 0:
            tail = result["stderr"]["tail"][-500:]
            raise cp.PermanentError(f"{key} exited {result['exit_code']}: {tail}")
    formatted = results["format"]["delta"]["count"]
    return f"Tests pass; {formatted} file(s) reformatted; dependencies vendored."


def touched(paths: list[str], results: dict[str, dict[str, Any]]) -> list[str]:
    """What the commit carries: the edited files and those the formatter rewrote."""
    formatted = [c["path"] for c in results["format"]["delta"]["changes"]]
    return sorted({*paths, *formatted})


def check(root: str, paths: list[str]) -> dict[str, Any]:
    """A local step: the edited Python files compile."""
    for path in paths:
        if path.endswith(".py"):
            compile((Path(root) / path).read_text(), path, "exec")
    return {"checked": sorted(paths)}


def migrate(ctx: cp.Context, env: Env) -> None:
    """The schema migrations, one act per file (keys ``migrate:<file>``)."""
    conn = sqlite3.connect(env.database)
    try:
        Migrations(conn, env.migrations).apply(ctx)
    finally:
        conn.close()


def _database(env: Env, sql: str) -> list[Any]:
    """Rows of the app database (none before it exists: nothing migrated yet)."""
    if not env.database.exists():
        return []
    conn = sqlite3.connect(env.database)
    try:
        return [list(row) for row in conn.execute(sql).fetchall()]
    except sqlite3.OperationalError:  # the table is not there yet
        return []
    finally:
        conn.close()


def make_workflow(env: Env) -> cp.Workflow[dict[str, Any]]:
    @cp.workflow("code-agent", version="1")
    def code_agent(ctx: cp.Context, task: str) -> dict[str, Any]:
        plan = ctx.decide("plan", env.model, "plan", task)
        paths = [edit["path"] for edit in plan["edits"]]
        for edit in plan["edits"]:
            ctx.act(f"edit:{edit['path']}", env.workspace, **edit)
        ctx.step("check", check, str(env.workspace.root), paths)
        done = {key: ctx.act(key, env.shell, **params) for key, params in commands()}
        checks = report(done)
        migrate(ctx, env)
        message = ctx.decide("commit-message", env.model, "commit-message", plan["title"])
        ctx.act("commit", env.git, op="commit", message=message, paths=touched(paths, done))
        ctx.act("branch", env.git, op="branch", name=plan["branch"])
        pr = ctx.act(
            "open-pr",
            env.pulls,
            body={"title": plan["title"], "head": plan["branch"], "base": "main", "body": checks},
        )
        note = ctx.act(
            "notify",
            env.notify,
            body={"channel": "#agents", "text": f"PR #{pr['number']}: {plan['title']}"},
        )
        return {"pr": pr["number"], "notification": note["id"]}

    return code_agent


def fingerprint(env: Env) -> str:
    """The working tree, git's trees at HEAD and on every branch, the forge's records.
    (Commit ids are left out: they hold the commit time.)"""
    state = {
        # pip's RECORD and direct_url.json name the wheel by its absolute path
        "workspace": env.workspace.fingerprint(
            exclude=["vendor/*/RECORD", "vendor/*/direct_url.json"]
        ),
        "head": env.git_out("log", "--format=%T", "HEAD").split(),  # trees, newest first
        "branches": env.git_out("for-each-ref", "--format=%(refname) %(tree)", "refs/heads"),
        "forge": env.forge.resources(),
        "database": [
            _database(env, "SELECT * FROM greetings ORDER BY name"),
            _database(env, "SELECT name FROM schema_log ORDER BY name"),
            # the receipts, but for their commit time
            _database(
                env,
                "SELECT operation_id, intent_digest, run_id, step, result "
                "FROM crashproof_receipts ORDER BY operation_id",
            ),
        ],
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def effects(env: Env) -> dict[str, int]:
    """From the targets' own records: commits per operation trailer in git's history, the
    agent's branch, and what the forge created per idempotency key."""
    log = env.git_out("log", "--all", f"--format=%(trailers:key={OPERATION_TRAILER},valueonly)")
    counts = Counter(line.strip() for line in log.splitlines() if line.strip())
    branch = SCRIPT["plan"]["branch"]
    if env.git_out("for-each-ref", "--format=%(refname)", f"refs/heads/{branch}"):
        counts[f"{RUN_ID}/branch"] += 1
    counts.update(env.forge.created())
    applied = _database(env, "SELECT name FROM schema_log")  # one row per application
    counts.update(f"{RUN_ID}/migrate:{row[0]}" for row in applied)
    return dict(counts)


SCENARIO = Scenario(
    name="code-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects,
    model_calls=lambda env: env.model.calls(),
    outage=outage,
)
