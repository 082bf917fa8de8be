"""The console through Starlette's TestClient: every page, filter and action, and the
inputs it must refuse (a wrong token, a missing CSRF token, a foreign Host header)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import crashproof as cp
from crashproof.console import ConsoleConfig, create_app

from .conftest import World, operator


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_runs_page_lists_every_run_with_budget_and_counts(client: TestClient) -> None:
    page = client.get("/runs")
    assert page.status_code == 200
    for run_id in ("greet-1", "notify-1", "cleanup-1", "swerve-1", "forge-1", "later-1"):
        assert f">{run_id}</a>" in page.text
    assert "greet@1" in page.text
    assert "0.0020" in page.text
    assert 'data-count="needs_review">needs_review: 2' in page.text
    assert 'data-count="awaiting_approval">awaiting_approval: 1' in page.text
    assert 'data-count="outbox">outbox: 1' in page.text
    assert client.get("/").url.path == "/runs"


def test_runs_filters_and_search(client: TestClient) -> None:
    frozen = client.get("/runs", params={"status": "needs_review"}).text
    assert ">swerve-1</a>" in frozen
    assert ">greet-1</a>" not in frozen
    by_workflow = client.get("/runs", params={"workflow": "notify"}).text
    assert ">notify-1</a>" in by_workflow
    assert ">swerve-1</a>" not in by_workflow
    searched = client.get("/runs", params={"q": "clean"}).text
    assert ">cleanup-1</a>" in searched
    assert "1 run(s) match" in searched
    assert "no runs match" in client.get("/runs", params={"q": "nothing-like-it"}).text
    bad = client.get("/runs", params={"status": "<b>x</b>"})
    assert bad.status_code == 400
    assert "&lt;b&gt;x&lt;/b&gt;" in bad.text
    recent = client.get("/runs", params={"since": "1h"}).text
    assert ">greet-1</a>" in recent
    assert "no runs match" in client.get("/runs", params={"since": "2999-01-01"}).text
    assert "no runs match" in client.get("/runs", params={"until": "2000-01-01T00:00"}).text
    window = client.get("/runs", params={"since": "2000-01-01", "until": "2999-01-01"}).text
    assert ">greet-1</a>" in window
    bad_time = client.get("/runs", params={"since": "<i>soon</i>"})
    assert bad_time.status_code == 400
    assert "&lt;i&gt;soon&lt;/i&gt;" in bad_time.text


def test_runs_are_paged(world: World, client: TestClient) -> None:
    flow = world.ledger.workflows["swerve"]
    world.flags["swerve"] = False
    for n in range(60):
        with pytest.raises(cp.CrashproofError):  # each stops resumable (a non-JSON result)
            world.ledger.run(flow, run_id=f"bulk-{n:02d}")
    first = client.get("/runs", params={"workflow": "swerve"}).text
    assert "61 run(s) match; showing 1\u201350" in first
    assert first.count('<tr>\n  <td><a href="/run') == 50
    second = client.get("/runs", params={"workflow": "swerve", "offset": 50}).text
    assert "showing 51\u201361" in second


def test_a_run_page_shows_decisions_and_acts(client: TestClient) -> None:
    greet = client.get("/run", params={"id": "greet-1"}).text
    assert "fake-model-1" in greet
    assert ">15<" in greet
    assert "0.0020" in greet
    notify = client.get("/run", params={"id": "notify-1"}).text
    assert "notify-1/notify" in notify  # the operation id
    assert "tool chat" in notify
    assert "pending" in notify
    cleanup = client.get("/run", params={"id": "cleanup-1"}).text
    assert "receipt <code>" in cleanup  # the first act's receipt
    assert re.search(r"fencing \d+", cleanup)  # the drive's token when it wrote the intent
    assert "cleanup-1/note" in cleanup
    assert "tool workspace" in cleanup
    assert "crashproof approve cleanup-1 drop --key APPROVER.pem" in cleanup
    assert "Resume this run" in cleanup


def test_a_recorded_script_is_shown_escaped(client: TestClient) -> None:
    page = client.get("/run", params={"id": "greet-1"}).text
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x1b" not in page
    assert "\\u001b[2J" in page  # as JSON writes it (crashproof show --json does too)
    header = client.get("/runs", params={"q": "greet"}).text
    assert "\x1b" not in header


def test_a_run_id_with_markup_and_an_escape_sequence(world: World, client: TestClient) -> None:
    run_id = "evil-<script>x</script>\x1b]52;c;aGk=\x07\u202e"
    world.ledger.run(world.ledger.workflows["greet"], run_id=run_id, name="x")
    for page in (client.get("/runs").text, client.get("/run", params={"id": run_id}).text):
        assert "<script>x" not in page
        assert "\x1b" not in page
        assert "\u202e" not in page
        assert "evil-&lt;script&gt;x&lt;/script&gt;\\x1b]52;c;aGk=\\x07\\u202e" in page


def test_an_act_with_an_unknown_outcome_and_a_receipt_conflict(client: TestClient) -> None:
    page = client.get("/run", params={"id": "forge-1"}).text
    assert "<strong>UNKNOWN</strong> 1" in page
    assert "TimeoutError the forge did not answer" in page
    assert "e" * 64 in page  # the tool's digest, beside the journal's
    assert "crashproof review decide forge-1#" in page
    assert "<script>" not in page


def test_unknown_and_path_like_run_ids(client: TestClient) -> None:
    for run_id in ("no-such-run", "../../etc/passwd", "<img src=x onerror=alert(1)>"):
        page = client.get("/run", params={"id": run_id})
        assert page.status_code == 404
        assert "<img" not in page.text
    assert "&lt;img src=x" in page.text


def test_attention_page_shows_cases_approvals_and_outbox(client: TestClient) -> None:
    page = client.get("/attention").text
    assert ">swerve-1</a>" in page
    assert ">cleanup-1</a>" in page
    assert "the journal: pending intent" in page
    assert "the tool: receipt" in page
    assert "crashproof review decide swerve-1#" in page
    assert "swerve-1#" in page
    assert " --abort " in page
    assert "--key REVIEWER.pem" not in page  # one command: the operator identity signs
    assert "it would release this act" in page
    assert "old.txt" in page
    assert "build 7 is green" in page
    assert "Dispatch pending messages" in page


def test_dispatch_through_the_page_delivers_once(world: World, client: TestClient) -> None:
    csrf = _csrf(client.get("/attention").text)
    world.flags["chat_down"] = False
    done = client.post("/actions/dispatch", data={"csrf": csrf})
    assert done.status_code == 200
    assert "1 message(s) delivered, 0 still pending" in done.text
    assert world.sent == ["notify-1/notify"]
    again = client.post("/actions/dispatch", data={"csrf": csrf})
    assert "0 message(s) delivered" in again.text
    assert world.sent == ["notify-1/notify"]
    assert 'data-count="outbox">outbox: 0' in client.get("/runs").text


def test_resume_through_the_page(world: World, client: TestClient) -> None:
    csrf = _csrf(client.get("/run", params={"id": "later-1"}).text)
    world.flags["ready"] = True
    done = client.post("/actions/resume", data={"csrf": csrf, "run_id": "later-1"})
    assert done.status_code == 200, done.text
    assert "run &#39;later-1&#39;: succeeded" in done.text
    assert world.ledger.get_run("later-1").status.value == "succeeded"
    frozen = client.post("/actions/resume", data={"csrf": csrf, "run_id": "swerve-1"})
    assert frozen.status_code == 409
    assert "RunFrozen" in frozen.text
    missing = client.post("/actions/resume", data={"csrf": csrf, "run_id": "nope"})
    assert missing.status_code == 404


def test_cancel_through_the_page(world: World, client: TestClient) -> None:
    shown = client.get("/run", params={"id": "later-1"}).text
    assert 'id="cancel-form"' in shown
    csrf = _csrf(shown)
    forged = client.post("/actions/cancel", data={"run_id": "later-1", "by": "erin"})
    assert forged.status_code == 403
    assert world.ledger.get_run("later-1").status.value == "running"
    done = client.post(
        "/actions/cancel",
        data={"csrf": csrf, "run_id": "later-1", "by": "erin", "reason": "<script>x</script>"},
    )
    assert done.status_code == 200, done.text
    info = world.ledger.get_run("later-1")
    assert info.status.value == "cancelled"
    assert info.reason == "cancelled by erin: <script>x</script>"
    page = client.get("/run", params={"id": "later-1"}).text
    assert "s-cancelled" in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    assert "<script>x</script>" not in page
    assert 'id="cancel-form"' not in page  # an ended run offers no cancel
    again = client.post("/actions/cancel", data={"csrf": csrf, "run_id": "later-1", "by": "erin"})
    assert again.status_code == 409
    assert "nothing was changed" in again.text
    world.flags["ready"] = True
    refused = client.post("/actions/resume", data={"csrf": csrf, "run_id": "later-1"})
    assert refused.status_code == 409
    assert "was cancelled by erin" in refused.text


def test_fork_through_the_page(world: World, client: TestClient) -> None:
    shown = client.get("/run", params={"id": "greet-1"}).text
    assert 'id="fork-form"' in shown
    preview = client.get("/run/fork", params={"id": "greet-1", "from_step": "compose"}).text
    assert 'id="run-again"' in preview
    csrf = _csrf(preview)
    data = {"run_id": "greet-1", "from_step": "compose", "new_run_id": "greet-2", "by": "erin"}
    assert client.post("/actions/fork", data=data).status_code == 403  # no CSRF token
    assert world.ledger.store.get_run("greet-2") is None
    done = client.post("/actions/fork", data={**data, "csrf": csrf})
    assert done.status_code == 200, done.text
    forked = world.ledger.journal("greet-2")
    assert [e.key for e in forked if e.type.value == "step_done"] == ["compose"]
    assert forked[-1].type.value == "run_forked"
    assert forked[-1].payload["by"] == "erin"
    page = client.get("/run", params={"id": "greet-2"}).text
    assert "greet-2" in page
    refused = client.post(
        "/actions/fork", data={**data, "csrf": csrf, "new_run_id": "greet-3", "from_step": "<b>"}
    )
    assert refused.status_code == 409
    assert "&lt;b&gt;" in refused.text
    assert "<b>" not in refused.text
    assert world.ledger.store.get_run("greet-3") is None
    again = client.post("/actions/fork", data={**data, "csrf": csrf})  # greet-2 exists
    assert again.status_code == 409


def test_a_post_without_the_csrf_token_changes_nothing(world: World, client: TestClient) -> None:
    world.flags.update(ready=True, chat_down=False)
    for data in ({"run_id": "later-1"}, {"run_id": "later-1", "csrf": "forged"}):
        refused = client.post("/actions/resume", data=data)
        assert refused.status_code == 403
        assert "CSRF" in refused.text
    assert client.post("/actions/dispatch", data={}).status_code == 403
    for action in ("approve", "reject", "decide", "retry", "cancel", "fork"):
        data = {"run_id": "cleanup-1", "reason": "x", "csrf": "forged"}
        assert client.post(f"/actions/{action}", data=data).status_code == 403, action
    assert world.ledger.get_run("cleanup-1").status.value == "awaiting_approval"
    assert world.ledger.get_run("later-1").status.value == "running"
    assert world.sent == []


def test_a_token_console_refuses_a_wrong_or_missing_token(world: World) -> None:
    config = ConsoleConfig(ledger=world.ledger, token="s3cret", loopback=False)
    with TestClient(create_app(config), base_url="http://10.0.0.5:8765") as c:
        assert c.get("/runs").status_code == 401
        assert c.get("/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/runs", params={"token": "wrong"}).status_code == 401
        assert c.post("/actions/dispatch", data={}).status_code == 401
        ok = c.get("/runs", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        opened = c.get("/runs", params={"token": "s3cret"}, follow_redirects=False)
        assert opened.status_code == 303
        assert "crashproof_token" in opened.headers["set-cookie"]
        assert c.get("/runs").status_code == 200  # the cookie now carries it


def test_a_loopback_console_refuses_a_foreign_host_header(world: World) -> None:
    with TestClient(
        create_app(ConsoleConfig(ledger=world.ledger)), base_url="http://evil.example"
    ) as c:
        assert c.get("/runs").status_code == 403
    with TestClient(
        create_app(ConsoleConfig(ledger=world.ledger)), base_url="http://localhost:1"
    ) as c:
        assert c.get("/runs").status_code == 200


def test_import_crashproof_and_its_cli_need_no_starlette() -> None:
    code = (
        "import sys, crashproof, crashproof.cli; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('starlette', 'jinja2', 'uvicorn', 'crashproof.console')); "
        "assert not loaded and 'crashproof.console' not in sys.modules, loaded"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_what_changes_elsewhere_shows_on_the_next_page(world: World, client: TestClient) -> None:
    """Folds between pages never hide a delivery or a resume made by another process."""
    assert 'data-count="outbox">outbox: 1' in client.get("/attention").text
    assert 'id="run-status">running' in client.get("/run", params={"id": "later-1"}).text
    world.flags.update(chat_down=False, ready=True)
    assert world.ledger.dispatch_outbox([world.outbox]) == 1  # a worker's dispatch, say
    world.ledger.resume("later-1")
    assert 'data-count="outbox">outbox: 0' in client.get("/attention").text
    assert ", delivered" in client.get("/run", params={"id": "notify-1"}).text
    later = client.get("/run", params={"id": "later-1"}).text
    assert 'id="run-status">succeeded' in later


def test_the_audit_timeline_names_the_writers(client: TestClient) -> None:
    page = client.get("/run/timeline", params={"id": "cleanup-1"})
    assert page.status_code == 200
    assert "run_started" in page.text
    assert "approval" in page.text or "run_frozen" in page.text
    assert "Records 1\u2013" in page.text
    assert client.get("/run/timeline", params={"id": "<x>"}).status_code == 404
    assert (
        'href="/run/timeline?id=cleanup-1"' in client.get("/run", params={"id": "cleanup-1"}).text
    )


def test_live_refresh_is_opt_in_and_bounded(client: TestClient) -> None:
    assert 'http-equiv="refresh"' not in client.get("/runs").text
    assert 'content="5"' in client.get("/runs", params={"refresh": 5}).text
    assert 'content="2"' in client.get("/runs", params={"refresh": 1}).text  # 2 s at least
    assert 'http-equiv="refresh"' not in client.get("/runs", params={"refresh": "x"}).text


def test_a_drifted_act_is_on_the_attention_page(tmp_path: Path) -> None:
    ws = cp.Workspace(tmp_path / "ws")
    (tmp_path / "ws").mkdir()
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'd.db'}", key="ab" * 32)

    @ledger.workflow("edit")
    def edit(ctx: cp.Context) -> str:
        ctx.act("write", ws, op="write", path="a.txt", content="a\n")
        return "done"

    ledger.run(edit, run_id="d-1")
    app = create_app(ConsoleConfig(ledger=ledger))
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        assert "drifted: 0" in c.get("/runs").text
        (tmp_path / "ws" / "a.txt").write_text("<b>by hand</b>\n")
        ledger.reconcile("d-1", [ws], record=True, by="<i>alice</i>")
        page = c.get("/attention").text
        assert "drifted: 1" in page
        table = page[page.index('id="drifted"') :]
        assert "d-1" in table
        assert "<code>write</code>" in table
        assert "&lt;i&gt;alice&lt;/i&gt;" in table
        assert "<i>alice</i>" not in page
        (tmp_path / "ws" / "a.txt").write_text("a\n")
        ledger.reconcile("d-1", [ws], record=True, by="bob")
        assert "drifted: 0" in c.get("/attention").text
    assert ledger.get_run("d-1").status is cp.RunStatus.SUCCEEDED


def test_retry_through_the_page(tmp_path: Path) -> None:
    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'f.db'}", key="ab" * 32)
    fixed = tmp_path / "fixed"
    ran: list[str] = []

    def tests() -> str:
        ran.append("tests")
        if not fixed.exists():
            raise ValueError("tests failed")
        return "green"

    @ledger.workflow("fixable")
    def fixable(ctx: cp.Context) -> str:
        plan = ctx.decide("plan", lambda: ran.append("plan") or "p")
        return f"{plan}: {ctx.step('tests', tests)}"

    with pytest.raises(cp.RunFailed):
        ledger.run(fixable, run_id="f-1")
    app = create_app(ConsoleConfig(ledger=ledger, signer=operator(ledger, tmp_path)))
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        shown = c.get("/run", params={"id": "f-1"}).text
        assert 'id="retry-form"' in shown
        csrf = _csrf(shown)
        assert c.post("/actions/retry", data={"run_id": "f-1", "by": "erin"}).status_code == 403
        still = c.post("/actions/retry", data={"csrf": csrf, "run_id": "f-1", "by": "erin"})
        assert still.status_code == 409  # fails again: the failure shown, the run failed
        fixed.touch()
        done = c.post("/actions/retry", data={"csrf": csrf, "run_id": "f-1", "by": "erin"})
        assert done.status_code == 200, done.text
        assert "succeeded" in done.text
        assert 'id="retry-form"' not in c.get("/run", params={"id": "f-1"}).text
    assert ran == ["plan", "tests", "tests", "tests"]  # the decision was never asked again
    retried = [e for e in ledger.journal("f-1") if e.type.value == "run_retried"]
    assert [e.payload["by"] for e in retried] == ["erin", "erin"]


def test_a_retryable_stop_says_when_a_worker_tries_it_again(tmp_path: Path) -> None:
    """A run a model outage stopped waits for no person: its page says when a worker
    resumes it (the stored next attempt), and a run stopped by a budget says nothing."""

    @cp.workflow("outage", version="1")
    def outage(ctx: cp.Context) -> None:
        ctx.step("ask", lambda: (_ for _ in ()).throw(cp.Unavailable("503")))

    with cp.Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(cp.RunStopped):
            ledger.run(outage, run_id="o")
        with pytest.raises(cp.RunStopped):
            ledger.run(outage, run_id="b", options=cp.RunOptions(limits=cp.Limits(max_steps=0)))
        with TestClient(
            create_app(ConsoleConfig(ledger=ledger)), base_url="http://127.0.0.1:8765"
        ) as client:
            shown = client.get("/run", params={"id": "o"}).text
            assert "a worker resumes it as soon as one polls" in shown
            at = ledger.store.schedule_retry("o", 3600.0, 2)  # type: ignore[attr-defined]
            shown = client.get("/run", params={"id": "o"}).text
            assert "after 2 automatic attempts" in shown
            assert time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) in shown
            assert "next-attempt" not in client.get("/run", params={"id": "b"}).text


def test_a_long_resume_goes_on_in_the_background(tmp_path: Path) -> None:
    """A drive longer than the request's wait answers 202 and finishes in the console's
    thread; a second Resume meanwhile is refused; the page tells what happened."""
    import threading

    ledger = cp.Ledger(f"sqlite:///{tmp_path / 'slow.db'}")
    gate, entered = threading.Event(), threading.Event()
    slow = {"on": False}

    def wait() -> str:
        if slow["on"]:
            entered.set()
            if not gate.wait(30):
                raise TimeoutError("the test never opened the gate")
        return "done"

    @ledger.workflow("slow", version="1")
    def flow(ctx: cp.Context) -> Any:
        ctx.step("first", lambda: 1)
        if slow["on"]:  # new work after the recorded prefix: live on the resume
            ctx.step("wait", wait)
        return [1] if slow["on"] else {1}  # not JSON the first time: stopped, resumable

    with pytest.raises(cp.CrashproofError):
        ledger.run(flow, run_id="slow-1")
    slow["on"] = True
    config = ConsoleConfig(ledger=ledger, signer=operator(ledger, tmp_path), drive_wait=0.2)
    with TestClient(create_app(config), base_url="http://127.0.0.1:8765") as c:
        csrf = _csrf(c.get("/run", params={"id": "slow-1"}).text)
        started = c.post("/actions/resume", data={"csrf": csrf, "run_id": "slow-1"})
        assert started.status_code == 202, started.text
        assert "in the background" in started.text
        assert entered.wait(10)
        assert "driving this run in the background" in c.get("/run?id=slow-1").text
        busy = c.post("/actions/resume", data={"csrf": csrf, "run_id": "slow-1"})
        assert busy.status_code == 409
        assert "driving run" in busy.text
        gate.set()
        deadline = time.monotonic() + 20
        while ledger.get_run("slow-1").status.value != "succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while "last drive of it: succeeded" not in c.get("/run?id=slow-1").text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    ledger.close()
