"""Every console action in headless Chromium, as an operator clicks it: approve, reject,
decide, cancel, resume and fork. Each leaves its record in the journal, signed with the
operator's key where the CLI signs (the signature checked here against the registry),
journaled under the operator's name otherwise. A console without an identity shows why,
keeps its buttons off and refuses each action's POST with that reason, nothing done.

One world, one server per identity and one browser for the whole module (each test acts
on runs of its own), so the module costs one build and one Chromium start."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp
from crashproof.console import ConsoleConfig, Signer, create_app
from crashproof.integrity.signing import verify_statement
from crashproof.journal.records import EventType

from .conftest import World, build, operator
from .test_browser import CHROMIUM, _free_port

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
uvicorn = pytest.importorskip("uvicorn")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (apt-get install chromium, or set CRASHPROOF_CHROMIUM)",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("actions")
    w = build(root)
    (root / "ws2").mkdir()  # its own: cleanup-1's workspace must not drift
    (root / "ws2" / "keep.txt").write_text("reject me\n")
    ws = cp.Workspace(root / "ws2")
    policy = cp.Policy(
        "ops-2", allow={"workspace": "*"}, risk={"workspace": "high"}, approval_required={"high"}
    )

    @w.ledger.workflow("purge", version="1")
    def purge(ctx: cp.Context) -> str:
        ctx.act("drop", ws, op="delete", path="keep.txt")
        return "purged"

    with pytest.raises(cp.RunFrozen):
        w.ledger.run(purge, run_id="purge-1", options=cp.RunOptions(policy=policy))
    w.flags["root"] = root  # type: ignore[assignment]
    yield w
    w.ledger.close()


@pytest.fixture(scope="module")
def signer(world: World, tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return operator(world.ledger, tmp_path_factory.mktemp("erin"))


def _serve(config: ConsoleConfig) -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def acting(world: World, signer: Signer) -> Iterator[str]:
    yield from _serve(ConsoleConfig(ledger=world.ledger, tools=[world.outbox], signer=signer))


@pytest.fixture(scope="module")
def reading(world: World) -> Iterator[str]:
    why = "no operator identity at /nowhere/operator.pem: run `crashproof operator init`"
    yield from _serve(ConsoleConfig(ledger=world.ledger, read_only=why))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, acting: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=acting)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    context.close()
    assert errors == []


def _signed(world: World, run_id: str, type_: EventType, field: str) -> dict[str, Any]:
    """The run's one record of ``type_``: its signed document verifies with erin's key."""
    (event,) = [e for e in world.ledger.journal(run_id) if e.type is type_]
    assert event.payload["by"] == "erin"
    document = event.payload[field]
    pem = world.ledger.approvers()["erin"].public_key
    assert verify_statement(pem, document["statement"], document["signature"])
    return dict(document["statement"])


def test_approve_then_resume(world: World, page: Any) -> None:
    page.goto("/run?id=cleanup-1")
    assert "Buttons act as erin" in page.locator("#who").inner_text()
    page.click(".approval .approve")
    assert page.locator("#message-title").inner_text() == "Approved"
    assert "approved cleanup-1/drop as erin" in page.locator("#message").inner_text()
    statement = _signed(world, "cleanup-1", EventType.APPROVAL_GRANTED, "approval")
    assert (statement["approver"], statement["step"]) == ("erin", "drop")
    page.goto("/run?id=cleanup-1")
    page.click("#resume")
    assert page.locator("#message-title").inner_text() == "Resumed"
    assert "succeeded" in page.locator("#message").inner_text()
    kinds = [e.type for e in world.ledger.journal("cleanup-1")]
    assert EventType.APPROVAL_CONSUMED in kinds
    assert kinds[-1] is EventType.RUN_SUCCEEDED
    assert "last drive of it: succeeded" in page.goto("/run?id=cleanup-1").text()


def test_reject_then_resume(world: World, page: Any) -> None:
    page.goto("/attention")
    approval = page.locator("#approval-purge-1")
    approval.locator(".reject-reason").fill("not on a <b>Friday</b>")
    approval.locator(".reject").click()
    assert page.locator("#message-title").inner_text() == "Rejected"
    statement = _signed(world, "purge-1", EventType.APPROVAL_REJECTED, "rejection")
    assert statement["reason"] == "not on a <b>Friday</b>"
    page.goto("/run?id=purge-1")
    page.click("#resume")
    assert "failed" in page.locator("#message").inner_text()  # uncaught: the run fails
    info = world.ledger.get_run("purge-1")
    assert "ApprovalRejected" in (info.reason or "")
    assert (Path(str(world.flags["root"])) / "ws2" / "keep.txt").exists()  # never executed


def test_decide_a_review_case(world: World, page: Any) -> None:
    page.goto("/run?id=swerve-1")
    page.click(".case .decide[data-decision=abort]")
    assert page.locator("#message-title").inner_text() == "Decided"
    assert "the run is now failed" in page.locator("#message").inner_text()
    statement = _signed(world, "swerve-1", EventType.REVIEW_DECIDED, "decision")
    assert (statement["decision"], statement["reviewer"]) == ("abort", "erin")


def test_cancel(world: World, page: Any) -> None:
    page.goto("/run?id=later-1")
    page.fill("#cancel-reason", "wrong <b>ticket</b>")
    page.click("#cancel")
    assert page.locator("#message-title").inner_text() == "Cancelled"
    (event,) = [e for e in world.ledger.journal("later-1") if e.type is EventType.RUN_CANCELLED]
    assert event.payload["by"] == "erin"
    page.goto("/run?id=later-1")
    assert "cancelled by erin: wrong <b>ticket</b>" in page.locator("#header").inner_text()


def test_fork_lists_the_acts_first(world: World, page: Any) -> None:
    page.goto("/run?id=notify-1")
    page.fill("#fork-step", "build")
    page.click("#fork-preview")
    again = page.locator("#run-again .again")
    assert again.count() == 1
    assert "notify-1/notify" in again.first.inner_text()
    page.fill("#fork-id", "notify-2")
    page.click("#fork")
    assert page.locator("#message-title").inner_text() == "Forked"
    assert "acts it will run again: notify" in page.locator("#message").inner_text()
    (event,) = [e for e in world.ledger.journal("notify-2") if e.type is EventType.RUN_FORKED]
    assert (event.payload["by"], event.payload["from_step"]) == ("erin", "build")


def test_without_an_identity_each_action_is_refused_with_its_reason(
    world: World, browser: Any, reading: str
) -> None:
    context = browser.new_context(base_url=reading)
    tab = context.new_page()
    tab.goto("/attention")
    assert "Read-only: no operator identity" in tab.locator("#read-only").inner_text()
    assert tab.locator(".case .decide").first.is_disabled()
    tab.goto("/run?id=forge-1")
    assert tab.locator("#resume").is_disabled()
    assert tab.locator("#cancel").is_disabled()
    csrf = tab.locator("input[name=csrf]").first.get_attribute("value")
    before = {r: len(world.ledger.journal(r)) for r in ("forge-1", "greet-1")}
    posts = {
        "approve": {"run_id": "forge-1"},
        "reject": {"run_id": "forge-1", "reason": "no"},
        "decide": {"run_id": "forge-1", "case_id": "forge-1#3", "decision": "abort"},
        "cancel": {"run_id": "forge-1"},
        "resume": {"run_id": "forge-1"},
        "retry": {"run_id": "forge-1"},
        "fork": {"run_id": "greet-1", "from_step": "compose", "new_run_id": "greet-9"},
    }
    for action, form in posts.items():
        answer = tab.request.post(f"/actions/{action}", form={"csrf": csrf, **form})
        assert answer.status == 403, action
        assert "read-only: no operator identity" in answer.text(), action
    assert {r: len(world.ledger.journal(r)) for r in before} == before
    assert world.ledger.store.get_run("greet-9") is None
    context.close()
