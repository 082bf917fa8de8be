"""A code agent on the official ``openai`` SDK, and the scenario that proves its recovery.

The loop is the one every tool-calling agent has: ask the model, append its answer, run
the tools it called, append their results, until it answers without a tool call. The
model is ``openai.OpenAI`` talking Chat Completions over HTTP to a local server written
for the example (``_model_server.py``), which plays a scripted conversation with a fresh
random nonce in every answer and counts the requests per turn. Its tools:

- ``read_file``: a function, so a step (``chat/0:read_file``);
- ``edit_file``: a ``cp.Workspace`` (a state-addressed act: a patch applied once);
- ``run_tests``: a function (a step) that runs the repository's tests in process;
- ``git``: a ``GitTool`` (commit with a ``Crashproof-Operation:`` trailer, branch);
- ``open_pr``: an ``HttpTool`` against the local forge of ``_forge.py``
  (``Idempotency-Key``, looked up by key);
- ``notify``: a ``cp.Outbox`` delivering to the forge's ``/notifications`` with the
  operation id as dedupe key.

``crashproof.models.openai_chat`` records each model call as a decision (never asked
again once recorded) and ``run_tools`` turns each tool call into its step or act.
``openai_agent_plain.py`` is the same agent without crashproof.

Verify it from the repository root, every crash point in each mode::

    crashproof verify examples.openai_agent:SCENARIO
    crashproof verify examples.openai_agent:SCENARIO --mode subprocess
    crashproof verify examples.openai_agent:SCENARIO --mode powercut

The fingerprint covers the working tree, the trees git holds at HEAD and on every branch,
and the forge's records (the pull request, the notification); effects are counted from
git's history (operation trailers, the branch ref) and the forge's own records; model
calls from the model server's log.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

import crashproof as cp
from crashproof.tools.git import OPERATION_TRAILER, GitTool
from crashproof.tools.http import HttpTool
from crashproof.verify import Scenario

from ._forge import Forge
from ._model_server import ModelServer, Turn
from .code_agent import _git

RUN_ID = "example:openai-agent"
TASK = "greet() should greet the user by name; make the tests pass and open a PR"
MODEL = "gpt-4.1"
PRICES = {"gpt-4.1": cp.models.Price(input=2.0, output=8.0, cached_input=0.5)}
BRANCH = "agent/greet-by-name"
TITLE = "Greet users by name"

SEED = {
    "greet.py": 'def greet() -> str:\n    return "Hello!"\n',
    "test_greet.py": (
        "from greet import greet\n\n\n"
        "def test_greet_by_name() -> None:\n"
        '    assert greet("Ada") == "Hello, Ada!"\n'
    ),
}
PATCH = (
    "--- a/greet.py\n+++ b/greet.py\n@@ -1,2 +1,2 @@\n"
    "-def greet() -> str:\n"
    '-    return "Hello!"\n'
    "+def greet(name: str) -> str:\n"
    '+    return f"Hello, {name}!"\n'
)
# What the local model answers, turn by turn (its tool calls are the agent's plan).
SCRIPT: list[Turn] = [
    (
        "Reading the code and its test.",
        [("read_file", {"path": "greet.py"}), ("read_file", {"path": "test_greet.py"})],
    ),
    (
        "greet() must take a name.",
        [("edit_file", {"op": "patch", "path": "greet.py", "diff": PATCH})],
    ),
    ("Running the tests.", [("run_tests", {})]),
    (
        "The tests pass: committing on a branch.",
        [
            ("git", {"op": "commit", "message": f"{TITLE}\n", "paths": ["greet.py"]}),
            ("git", {"op": "branch", "name": BRANCH}),
        ],
    ),
    (
        "Opening the pull request.",
        [("open_pr", {"body": {"title": TITLE, "head": BRANCH, "base": "main"}})],
    ),
    ("Telling the team.", [("notify", {"channel": "#agents", "text": f"PR #1: {TITLE}"})]),
    ("Done: PR #1 makes greet() greet by name.", []),
]
SYSTEM = "You are a code agent. Use the tools to change the repository, test, commit, open a PR."


def _function(name: str, description: str, properties: dict[str, Any], *required: str) -> Any:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    schema["required"] = list(required)
    schema["additionalProperties"] = False
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


_TEXT = {"type": "string"}
TOOLS = [
    _function("read_file", "Read a file of the repository.", {"path": _TEXT}, "path"),
    _function(
        "edit_file",
        "Write a file, append to it, or apply a unified diff to it.",
        {
            "op": {"enum": ["write", "append", "patch"]},
            "path": _TEXT,
            "content": _TEXT,
            "text": _TEXT,
            "diff": _TEXT,
        },
        "op",
        "path",
    ),
    _function("run_tests", "Run the repository's tests.", {}),
    _function(
        "git",
        "Commit paths with a message, or create a branch at HEAD.",
        {
            "op": {"enum": ["commit", "branch"]},
            "message": _TEXT,
            "paths": {"type": "array", "items": _TEXT},
            "name": _TEXT,
        },
        "op",
    ),
    _function("open_pr", "Open a pull request.", {"body": {"type": "object"}}, "body"),
    _function(
        "notify",
        "Post a message to a channel.",
        {"channel": _TEXT, "text": _TEXT},
        "channel",
        "text",
    ),
]


@dataclass
class Env:
    repo: Path
    model: ModelServer
    client: openai.OpenAI
    forge: Forge
    http: httpx.Client
    workspace: cp.Workspace
    git: GitTool
    pulls: HttpTool

    def __post_init__(self) -> None:
        self.notify = cp.Outbox("chat", self.deliver)

    def close(self) -> None:
        self.client.close()
        self.http.close()
        self.model.stop()
        self.forge.stop()

    def read_file(self, path: str) -> str:
        return (self.repo / path).read_text(encoding="utf-8")

    def run_tests(self) -> str:
        return run_tests(self.repo)

    def deliver(self, message: cp.Message) -> str:
        """The outbox's delivery: at least once, deduplicated by the forge by key."""
        digest = hashlib.sha256(json.dumps(message.body, sort_keys=True).encode()).hexdigest()
        headers = {"Idempotency-Key": f'"{message.dedupe_key}"', "Crashproof-Intent-Digest": digest}
        answer = self.http.post(
            f"{self.forge.url}/notifications", json=message.body, headers=headers
        )
        answer.raise_for_status()  # not delivered: left pending for the next resume
        return str(answer.json()["id"])


def run_tests(root: Path) -> str:
    """Every ``test_*`` function of the ``test_*.py`` files, in process, with the
    repository's modules imported fresh from its files (no bytecode written, none kept:
    a later run, in another repository, imports its own)."""
    before, path, bytecode = set(sys.modules), list(sys.path), sys.dont_write_bytecode
    sys.path.insert(0, str(root))
    sys.dont_write_bytecode = True
    failed, passed = [], 0
    try:
        for test_file in sorted(root.glob("test_*.py")):
            namespace: dict[str, Any] = {"__name__": test_file.stem}
            exec(compile(test_file.read_text(), str(test_file.name), "exec"), namespace)
            for name, test in sorted(namespace.items()):
                if name.startswith("test_") and callable(test):
                    try:
                        test()
                        passed += 1
                    except Exception as exc:
                        failed.append(f"{test_file.name}::{name}: {type(exc).__name__} {exc}")
    finally:
        sys.path[:], sys.dont_write_bytecode = path, bytecode
        for name in set(sys.modules) - before:  # the repository's own, never a library's
            if str(getattr(sys.modules[name], "__file__", "")).startswith(f"{root}/"):
                del sys.modules[name]
    return "\n".join([*failed, f"{passed} passed, {len(failed)} failed"])


def make_env(directory: Path) -> Env:
    """A git repository, the model server and the forge; after a crash, the ones left."""
    repo = directory / "repo"
    if not repo.exists():
        repo.mkdir(parents=True)
        for name, text in SEED.items():
            (repo / name).write_text(text)
        _git(repo, "init", "-q", "-b", "main")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "Initial commit")
    model = ModelServer(SCRIPT, log=directory / "model.json").start()
    forge = Forge(directory / "forge.json").start()
    forge.ensure_repository("greeter", head=_git(repo, "rev-parse", "main"))
    # Plain HTTP on the loopback: no TLS, so no CA bundle to load for every environment.
    client = openai.OpenAI(
        api_key="local",
        base_url=model.url,
        http_client=openai.DefaultHttpxClient(verify=False, timeout=10.0),
    )
    http = httpx.Client(verify=False, timeout=10.0)
    lookup = "/by-key/{operation_id}"
    return Env(
        repo=repo,
        model=model,
        client=client,
        forge=forge,
        http=http,
        workspace=cp.Workspace(repo),
        git=GitTool(repo),
        pulls=HttpTool(forge.url, "/repos/greeter/pulls", lookup_path=lookup, client=http),
    )


def make_workflow(env: Env) -> cp.Workflow[int]:
    tools: dict[str, Any] = {
        "read_file": env.read_file,
        "edit_file": env.workspace,
        "run_tests": env.run_tests,
        "git": env.git,
        "open_pr": env.pulls,
        "notify": env.notify,
    }

    @cp.workflow("openai-agent", version="1")
    def openai_agent(ctx: cp.Context, task: str) -> int:
        llm = cp.models.openai_chat(ctx, env.client, prices=PRICES)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        while True:
            reply = llm.create(model=MODEL, messages=messages, tools=TOOLS)
            messages += llm.reply_messages(reply)
            results = llm.run_tools(reply, tools)
            if not results:
                return len(messages)
            messages += results

    return openai_agent


def fingerprint(env: Env) -> str:
    """The working tree, git's trees at HEAD and on every branch, the forge's records.
    (Commit ids are left out: they hold the commit time.)"""
    state = {
        "workspace": env.workspace.fingerprint(),
        "head": _git(env.repo, "log", "--format=%T", "HEAD").split(),
        "branches": _git(env.repo, "for-each-ref", "--format=%(refname) %(tree)", "refs/heads"),
        "forge": env.forge.resources(),
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def effects(env: Env) -> dict[str, int]:
    """Commits per operation trailer in git's history, the branch (under the operation id
    of the act that made it), and what the forge created per idempotency key."""
    log = _git(env.repo, "log", "--all", f"--format=%(trailers:key={OPERATION_TRAILER},valueonly)")
    counts = Counter(line.strip() for line in log.splitlines() if line.strip())
    if _git(env.repo, "for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH}"):
        counts[f"{RUN_ID}/chat.4/1:git"] += 1
    counts.update(env.forge.created())
    return dict(counts)


SCENARIO = Scenario(
    name="openai-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects,
    model_calls=lambda env: env.model.calls(),
)


if __name__ == "__main__":  # one run in a fresh directory: python -m examples.openai_agent
    import secrets
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = make_env(Path(tmp))
        key = secrets.token_bytes(32)  # a throwaway ledger, a throwaway key
        with contextlib.closing(env), cp.Ledger(f"sqlite:///{tmp}/runs.db", key=key) as ledger:
            print(ledger.run(make_workflow(env), run_id=RUN_ID, task=TASK), "messages")
            print("model calls:", env.model.calls())
            print("forge:", env.forge.resources())
