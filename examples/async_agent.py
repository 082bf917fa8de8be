"""The code agent of ``code_agent.py``, written async: ``async def`` workflow, an async
model, ``await ctx.act`` on ``AsyncHttpTool`` (the forge) and on the sync ``Workspace``,
``cp.Shell`` (its commands) and ``GitTool`` (run in worker threads). Same workflow name,
version, tools and journal: a run of either may be resumed by the other.

    crashproof verify examples.async_agent:SCENARIO
    crashproof verify examples.async_agent:SCENARIO --mode subprocess --max-points 20
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crashproof as cp
from crashproof.tools.http_async import AsyncHttpTool
from crashproof.tools.migrations import Migrations
from crashproof.verify import Scenario

from . import code_agent
from .code_agent import (
    RUN_ID,
    TASK,
    Env,
    check,
    commands,
    effects,
    fingerprint,
    report,
    touched,
)


@dataclass
class AsyncEnv(Env):
    apulls: AsyncHttpTool | None = None
    anotify: AsyncHttpTool | None = None


def make_env(directory: Path) -> AsyncEnv:
    env = code_agent.make_env(directory)
    lookup = "/by-key/{operation_id}"
    return AsyncEnv(
        **vars(env),
        apulls=AsyncHttpTool(
            env.forge.url, "/repos/greeter/pulls", lookup_path=lookup, observe_path="/repos/greeter"
        ),
        anotify=AsyncHttpTool(env.forge.url, "/notifications", lookup_path=lookup),
    )


def make_workflow(env: AsyncEnv) -> cp.Workflow[dict[str, Any]]:
    async def model(key: str, prompt: str) -> cp.Decision:
        await asyncio.sleep(0)  # a model SDK's await
        return env.model(key, prompt)

    @cp.workflow("code-agent", version="1")
    async def code_agent(ctx: cp.AsyncContext, task: str) -> dict[str, Any]:
        plan = await ctx.decide("plan", model, "plan", task)
        paths = [edit["path"] for edit in plan["edits"]]
        for edit in plan["edits"]:
            await ctx.act(f"edit:{edit['path']}", env.workspace, **edit)
        await ctx.step("check", check, str(env.workspace.root), paths)
        done = {key: await ctx.act(key, env.shell, **params) for key, params in commands()}
        checks = report(done)
        # The schema migrations (as code_agent.migrate); the acts run in worker threads.
        conn = sqlite3.connect(env.database, check_same_thread=False)
        try:
            migrations = Migrations(conn, env.migrations)
            for name, params in migrations.plan():
                await ctx.act(name, migrations, **params)
        finally:
            conn.close()
        message = await ctx.decide("commit-message", model, "commit-message", plan["title"])
        commit = touched(paths, done)
        await ctx.act("commit", env.git, op="commit", message=message, paths=commit)
        await ctx.act("branch", env.git, op="branch", name=plan["branch"])
        pr = await ctx.act(
            "open-pr",
            env.apulls,
            body={"title": plan["title"], "head": plan["branch"], "base": "main", "body": checks},
        )
        note = await ctx.act(
            "notify",
            env.anotify,
            body={"channel": "#agents", "text": f"PR #{pr['number']}: {plan['title']}"},
        )
        return {"pr": pr["number"], "notification": note["id"]}

    return code_agent


SCENARIO = Scenario(
    name="async-code-agent",
    workflow_factory=make_workflow,
    env_factory=make_env,
    fingerprint=fingerprint,
    inputs={"task": TASK},
    run_id=RUN_ID,
    effects=effects,
    model_calls=lambda env: env.model.calls(),
)
