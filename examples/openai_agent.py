"""A code agent on the official ``openai`` SDK, and the scenario that proves its recovery.

The loop is the one every tool-calling agent has: ask the model, append its answer, run
the tools it called, append their results, until it answers without a tool call. The
model is ``openai.OpenAI`` talking Chat Completions over HTTP to a local server written
for the example (``_model_server.py``), which plays a scripted conversation with a fresh
random nonce in every answer and counts the requests per turn. Its tools are the agent's
own (``agent_tools``: typed functions, their JSON schemas derived by ``cp.models.tool``):

- ``read_file(path)``: a read, so a step (``chat/0:read_file``);
- ``apply_patch(path, diff)``: an act of a ``cp.Workspace`` (a patch applied once);
- ``run_tests()``: a step that runs the repository's tests in process;
- ``commit(message, paths)``: an act of a ``GitTool`` (a ``Crashproof-Operation:``
  trailer);
- ``create_pull_request(title, branch)``: two acts, the branch (``GitTool``), then the
  pull request (an ``HttpTool`` against the local forge of ``_forge.py``,
  ``Idempotency-Key``, looked up by key; the function is its request template);
- ``notify(channel, text)``: a ``cp.Outbox`` delivering to the forge's
  ``/notifications`` with the operation id as dedupe key.

``crashproof.models.openai_chat`` records each model call as a decision (never asked
again once recorded) and ``run_tools`` turns each tool call into its step or acts; a
tool's error reaches the model as a tool message. ``openai_agent_plain.py`` is the same
agent without crashproof (the schemas written by hand, the SDK's retries on 429 and 5xx,
tool errors as messages); ``openai_agent_async.py`` and ``anthropic_agent.py`` are the
same agent on ``AsyncOpenAI`` and on ``anthropic``, each with its plain twin.

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
import inspect
import json
import sys
from collections import Counter
from collections.abc import Callable
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
# What the local model answers, turn by turn (its tool calls are the agent's plan), in the
# agent's own tools: the schemas cp.models.tool derives from agent_tools' signatures.
SCRIPT: list[Turn] = [
    (
        "Reading the code and its test.",
        [("read_file", {"path": "greet.py"}), ("read_file", {"path": "test_greet.py"})],
    ),
    ("greet() must take a name.", [("apply_patch", {"path": "greet.py", "diff": PATCH})]),
    ("Running the tests.", [("run_tests", {})]),
    ("The tests pass: committing.", [("commit", {"message": f"{TITLE}\n", "paths": ["greet.py"]})]),
    ("Opening the pull request.", [("create_pull_request", {"title": TITLE, "branch": BRANCH})]),
    ("Telling the team.", [("notify", {"channel": "#agents", "text": f"PR #1: {TITLE}"})]),
    ("Done: PR #1 makes greet() greet by name.", []),
]
SYSTEM = "You are a code agent. Use the tools to change the repository, test, commit, open a PR."


@dataclass
class Env:
    repo: Path
    model: ModelServer
    client: Any  # openai.OpenAI here; AsyncOpenAI, Anthropic in the other examples
    forge: Forge
    http: httpx.Client
    workspace: cp.Workspace
    git: GitTool
    pulls: HttpTool

    def __post_init__(self) -> None:
        self.notify = cp.Outbox("chat", self.deliver)

    def close(self) -> None:
        closed = self.client.close()
        if inspect.iscoroutine(closed):  # an async client: its connections belong to the
            closed.close()  # loops of the runs that used it, closed already; dropped
        self.http.close()
        self.model.stop()
        self.forge.stop()

    def deliver(self, message: cp.Message) -> str:
        """The outbox's delivery: at least once, deduplicated by the forge by key."""
        digest = hashlib.sha256(json.dumps(message.body, sort_keys=True).encode()).hexdigest()
        headers = {"Idempotency-Key": f'"{message.dedupe_key}"', "Crashproof-Intent-Digest": digest}
        answer = self.http.post(
            f"{self.forge.url}/notifications", json=message.body, headers=headers
        )
        answer.raise_for_status()  # not delivered: left pending for the next resume
        return str(answer.json()["id"])


def run_tests_in(root: Path) -> str:
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


def make_env(
    directory: Path, client: Callable[[ModelServer], Any] | None = None, key: str = ""
) -> Env:
    """A git repository, the model server and the forge; after a crash, the ones left.
    ``client``: the SDK client for the model server (default: ``openai.OpenAI``);
    ``key``: the stem of the decision keys, if a framework names them."""
    repo = directory / "repo"
    if not repo.exists():
        repo.mkdir(parents=True)
        for name, text in SEED.items():
            (repo / name).write_text(text)
        _git(repo, "init", "-q", "-b", "main")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "Initial commit")
    model = ModelServer(SCRIPT, log=directory / "model.json", key=key).start()
    forge = Forge(directory / "forge.json").start()
    forge.ensure_repository("greeter", head=_git(repo, "rev-parse", "main"))
    http = httpx.Client(verify=False, timeout=10.0)
    lookup = "/by-key/{operation_id}"
    return Env(
        repo=repo,
        model=model,
        client=(client or openai_client)(model),
        forge=forge,
        http=http,
        workspace=cp.Workspace(repo),
        git=GitTool(repo),
        pulls=HttpTool(forge.url, "/repos/greeter/pulls", lookup_path=lookup, client=http),
    )


def openai_client(model: ModelServer) -> openai.OpenAI:
    # Plain HTTP on the loopback: no TLS, so no CA bundle to load for every environment.
    http = openai.DefaultHttpxClient(verify=False, timeout=10.0)
    return openai.OpenAI(api_key="local", base_url=model.url, http_client=http)


def agent_tools(env: Env) -> list[cp.models.FunctionTool]:
    """The agent's tools, as the model sees them (schemas from the signatures), each
    with its effect class: reads are steps, effects are acts of a cp.Tool."""

    @cp.models.tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return (env.repo / path).read_text(encoding="utf-8")

    @cp.models.tool(act=env.workspace)
    def apply_patch(path: str, diff: str) -> dict[str, Any]:
        """Apply a unified diff to a file."""
        return {"op": "patch", "path": path, "diff": diff}

    @cp.models.tool
    def run_tests() -> str:
        """Run the repository's tests."""
        return run_tests_in(env.repo)

    @cp.models.tool(act=env.git)
    def commit(message: str, paths: list[str]) -> dict[str, Any]:
        """Commit files with a message."""
        return {"op": "commit", "message": message, "paths": paths}

    @cp.models.tool(act=[env.git, env.pulls])
    def create_pull_request(title: str, branch: str) -> list[dict[str, Any]]:
        """Push the last commit to a new branch and open a pull request for it."""
        pull = {"title": title, "head": branch, "base": "main"}
        return [{"op": "branch", "name": branch}, {"body": pull}]

    @cp.models.tool(act=env.notify)
    def notify(channel: str, text: str) -> dict[str, Any]:
        """Post a message to a channel."""
        return {"channel": channel, "text": text}

    return [read_file, apply_patch, run_tests, commit, create_pull_request, notify]


def make_workflow(env: Env) -> cp.Workflow[int]:
    tools = agent_tools(env)

    @cp.workflow("openai-agent", version="2")
    def openai_agent(ctx: cp.Context, task: str) -> int:
        llm = cp.models.openai_chat(ctx, env.client, prices=PRICES)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        while True:
            reply = llm.create(model=MODEL, messages=messages, tools=tools)
            messages += llm.reply_messages(reply)
            if not (results := llm.run_tools(reply)):
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


def effects_of(run_id: str, name: str) -> Callable[[Env], dict[str, int]]:
    """The effects of the run ``run_id`` whose recorder is named ``name``: commits per
    operation trailer in git's history, the branch (under the operation id of the act
    that made it), and what the forge created per idempotency key."""

    def effects(env: Env) -> dict[str, int]:
        log = _git(
            env.repo, "log", "--all", f"--format=%(trailers:key={OPERATION_TRAILER},valueonly)"
        )
        counts = Counter(line.strip() for line in log.splitlines() if line.strip())
        if _git(env.repo, "for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH}"):
            counts[f"{run_id}/{name}.5/0:create_pull_request/0"] += 1
        counts.update(env.forge.created())
        return dict(counts)

    return effects


SCENARIO = Scenario(
    name="openai-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects_of(RUN_ID, "chat"),
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
