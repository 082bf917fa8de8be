"""A ledger with one run of every kind the console shows, and the console over it.

- ``greet``: succeeded, a decision with model, tokens and cost, and an input holding
  ``<script>`` and an escape sequence (both must reach the page as text);
- ``notify``: succeeded with its outbox message undelivered (the chat server was down);
- ``cleanup``: awaiting approval of a risky act (a workspace delete);
- ``swerve``: needs_review (its code took another path on replay: a review case);
- ``forge``: needs_review on a receipt conflict (the forge's receipt binds another
  intent: both digests and the receipt, side by side);
- ``later``: stopped resumable (its result was not JSON until ``READY`` is set).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")

from starlette.testclient import TestClient

import crashproof as cp
from crashproof.console import ConsoleConfig, Signer, create_app
from crashproof.integrity.signing import generate_keypair, load_private_key

HOSTILE = "<script>alert(1)</script>\x1b[2J"


@dataclass
class World:
    ledger: cp.Ledger
    outbox: cp.Outbox
    sent: list[str] = field(default_factory=list)
    flags: dict[str, bool] = field(default_factory=dict)


def build(root: Path) -> World:
    ledger = cp.Ledger(f"sqlite:///{root / 'runs.db'}")
    world = World(ledger=ledger, outbox=None)  # type: ignore[arg-type]
    world.flags.update(chat_down=True, swerve=False, ready=False)

    def send(message: cp.Message) -> str:
        if world.flags["chat_down"]:
            raise ConnectionError("chat server down")
        world.sent.append(message.dedupe_key)
        return f"chat-{len(world.sent)}"

    world.outbox = cp.Outbox("chat", send)

    @ledger.workflow("greet", version="1")
    def greet(ctx: cp.Context, name: str) -> dict[str, Any]:
        text = ctx.step("compose", lambda: f"hello {name}")
        plan = ctx.decide(
            "choose",
            lambda: cp.Decision(
                {"times": 2},
                model="fake-model-1",
                usage={"input_tokens": 10, "output_tokens": 5},
                cost=0.002,
            ),
        )
        return {"text": text, "plan": plan}

    @ledger.workflow("notify", version="1")
    def notify(ctx: cp.Context, build: int) -> str:
        status = ctx.step("build", lambda: "green")
        ctx.act("notify", world.outbox, text=f"build {build} is {status}")
        return status

    (root / "ws").mkdir()
    (root / "ws" / "old.txt").write_text("keep me until approved\n")
    workspace = cp.Workspace(root / "ws")
    policy = cp.Policy(
        "ops-1",
        allow={"workspace": "*"},
        risk={"workspace": lambda tool, params: "high" if params["op"] == "delete" else "low"},
        approval_required={"high"},
    )

    @ledger.workflow("cleanup", version="1")
    def cleanup(ctx: cp.Context) -> str:
        ctx.act("note", workspace, op="append", path="log.txt", text="cleaning\n")
        ctx.act("drop", workspace, op="delete", path="old.txt")
        return "cleaned"

    @ledger.workflow("swerve", version="1")
    def swerve(ctx: cp.Context) -> Any:
        ctx.step("first", lambda: 1)
        ctx.step("other" if world.flags["swerve"] else "second", lambda: 2)
        return {3}  # not JSON: the run stops resumable, and the resume swerves

    class Forge(cp.Tool):
        """Its answer was lost (unknown), and its lookup finds a PR made for another intent."""

        name = "forge"
        version = "1"

        def execute(self, call: cp.Call) -> cp.Receipt:
            raise TimeoutError("the forge did not answer")

        def lookup(self, call: cp.Call) -> cp.Receipt | None:
            return cp.Receipt("pr-9", {"number": 9, "title": HOSTILE}, intent_digest="e" * 64)

    @ledger.workflow("forge", version="1")
    def forge(ctx: cp.Context) -> Any:
        return ctx.act("open-pr", Forge(), title="bump deps")

    @ledger.workflow("later", version="1")
    def later(ctx: cp.Context) -> Any:
        ctx.step("first", lambda: 1)
        return [1] if world.flags["ready"] else {1, 2}

    ledger.run(greet, run_id="greet-1", name=HOSTILE)
    ledger.run(notify, run_id="notify-1", build=7)
    with pytest.raises(cp.RunFrozen):
        ledger.run(cleanup, run_id="cleanup-1", options=cp.RunOptions(policy=policy))
    with pytest.raises(cp.CrashproofError):
        ledger.run(swerve, run_id="swerve-1")
    world.flags["swerve"] = True
    with pytest.raises(cp.RunFrozen):
        ledger.resume("swerve-1")
    with pytest.raises(cp.RunFrozen):
        ledger.run(forge, run_id="forge-1")
    with pytest.raises(cp.CrashproofError):
        ledger.run(later, run_id="later-1")
    return world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = build(tmp_path)
    yield w
    w.ledger.close()


def operator(ledger: cp.Ledger, root: Path, name: str = "erin") -> Signer:
    """A registered approver's key, as ``crashproof operator init`` leaves one: what the
    console acts as."""
    path = root / f"{name}.pem"
    generate_keypair(path)
    ledger.add_approver(name, path.with_name(path.name + ".pub").read_text(), by="root")
    return Signer(load_private_key(path), name)


@pytest.fixture
def signer(world: World, tmp_path: Path) -> Signer:
    return operator(world.ledger, tmp_path)


@pytest.fixture
def client(world: World, signer: Signer) -> Iterator[TestClient]:
    app = create_app(ConsoleConfig(ledger=world.ledger, tools=[world.outbox], signer=signer))
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        yield c
