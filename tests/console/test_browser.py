"""The console in headless Chromium (Debian's ``chromium``, driven by Playwright through
``executable_path``: Playwright's own browser download is not used). Each page is kept
as a screenshot under the test's tmp dir (``*.png``), the artefacts a person looks at.

Skipped, with the reason, when Playwright or a Chromium binary is missing; CI installs
``chromium`` (``.ci/run``)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashproof.console import ConsoleConfig, Signer, create_app

from .conftest import World

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
uvicorn = pytest.importorskip("uvicorn")

CHROMIUM = os.environ.get("CRASHPROOF_CHROMIUM") or next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (apt-get install chromium, or set CRASHPROOF_CHROMIUM)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def base_url(world: World, signer: Signer) -> Iterator[str]:
    port = _free_port()
    app = create_app(
        ConsoleConfig(
            ledger=world.ledger, tools=[world.outbox], app_flags="--app flows", signer=signer
        )
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def page(base_url: str, tmp_path: Path) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        tab = browser.new_page(viewport={"width": 1400, "height": 900}, base_url=base_url)
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
        yield tab
        browser.close()
        assert errors == []  # no script ran: no alert(), no error


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def test_runs_list_and_filters(page: Any, tmp_path: Path) -> None:
    page.goto("/runs")
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 6
    assert "needs_review: 2" in page.locator("#counts").inner_text()
    _shot(page, tmp_path, "runs")
    page.select_option("select[name=status]", "needs_review")
    page.click("#filters button")
    assert page.locator("#runs tbody tr").count() == 2
    assert "swerve-1" in page.locator("#runs tbody").inner_text()
    assert "greet-1" not in page.locator("#runs tbody").inner_text()
    page.select_option("select[name=status]", "")
    page.select_option("select[name=workflow]", "notify")
    page.click("#filters button")
    assert page.locator("#runs tbody").inner_text().startswith("notify-1")
    page.fill("input[name=q]", "zzz")
    page.click("#filters button")
    assert "no runs match" in page.locator("#runs").inner_text()
    _shot(page, tmp_path, "runs-filtered")


def test_a_run_timeline_with_a_script_shown_as_text(page: Any, tmp_path: Path) -> None:
    page.goto("/runs")
    page.click("text=greet-1")
    assert page.locator("#run-status").inner_text() == "succeeded"
    steps = page.locator("#steps").inner_text()
    assert "choose" in steps
    assert "fake-model-1" in steps
    assert "0.0020" in steps
    result = page.locator("#result").inner_text()
    assert "<script>alert(1)</script>\\u001b[2J" in result  # text, never a script
    assert page.locator("script").count() == 0
    _shot(page, tmp_path, "run-greet")


def test_a_review_case_side_by_side_and_a_pending_approval(page: Any, tmp_path: Path) -> None:
    page.goto("/attention")
    case = page.locator(".case", has_text="receipt conflict")
    journal_side, tool_side = case.locator(".journal-side"), case.locator(".tool-side")
    assert "pending intent" in journal_side.inner_text()
    assert "bump deps" in journal_side.inner_text()
    assert "e" * 64 in tool_side.inner_text()
    assert "pr-9" in tool_side.inner_text()
    box_j, box_t = journal_side.bounding_box(), tool_side.bounding_box()
    assert box_j["x"] < box_t["x"]
    assert abs(box_j["y"] - box_t["y"]) < 5
    assert "crashproof review decide forge-1#" in case.inner_text()
    approval = page.locator(".approval").first.inner_text()
    assert "it would release this act" in approval
    assert "old.txt" in approval
    assert "crashproof approve cleanup-1 drop --key APPROVER.pem" in approval
    _shot(page, tmp_path, "attention")
    page.goto("/run?id=forge-1")
    assert "UNKNOWN" in page.locator("#steps").inner_text()
    _shot(page, tmp_path, "run-forge")


def test_resume_and_dispatch_through_the_page(world: World, page: Any, tmp_path: Path) -> None:
    world.flags.update(ready=True, chat_down=False)
    page.goto("/run?id=later-1")
    assert page.locator("#run-status").inner_text() == "running"
    _shot(page, tmp_path, "run-later-before")
    page.click("#resume")
    assert page.locator("#message-title").inner_text() == "Resumed"
    assert "succeeded" in page.locator("#message").inner_text()
    _shot(page, tmp_path, "resumed")
    page.goto("/attention")
    page.click("#dispatch")
    assert "1 message(s) delivered, 0 still pending" in page.locator("#message").inner_text()
    assert world.sent == ["notify-1/notify"]
    assert "outbox: 0" in page.locator("#counts").inner_text()
    _shot(page, tmp_path, "dispatched")


def test_cancel_through_the_page(world: World, page: Any, tmp_path: Path) -> None:
    page.goto("/run?id=later-1")
    assert page.locator("#run-status").inner_text() == "running"
    page.fill("#cancel-reason", "wrong <b>ticket</b>")
    page.click("#cancel")
    assert page.locator("#message-title").inner_text() == "Cancelled"
    page.goto("/run?id=later-1")
    assert page.locator("#run-status").inner_text() == "cancelled"
    assert page.locator("#cancel-form").count() == 0  # an ended run offers no cancel
    assert "cancelled by erin: wrong <b>ticket</b>" in page.locator("#header").inner_text()
    assert world.ledger.get_run("later-1").status.value == "cancelled"
    _shot(page, tmp_path, "cancelled")
