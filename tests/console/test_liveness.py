"""Liveness on the console (#40): a run whose process was SIGKILLed shows its owner and
an expired lease on its page and is listed on Needs attention as a run nobody drives; a
failed run is listed there too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette")

from starlette.testclient import TestClient

import crashproof as cp
from crashproof.console import ConsoleConfig, create_app

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import crashproof as cp

    ledger = cp.Ledger(sys.argv[1], lease_seconds=0.5)

    @ledger.workflow("long", version="1")
    def long(ctx):
        ctx.step("first", lambda: 1)
        ctx.step("die", lambda: os.kill(os.getpid(), signal.SIGKILL))

    ledger.run(long, run_id="killed-1")
    """
)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url], env=os.environ.copy(), capture_output=True, timeout=60
    )
    assert child.returncode == -9, child.stderr  # a real SIGKILL mid-run
    ledger = cp.Ledger(url)

    @ledger.workflow("fails", version="1")
    def fails(ctx: cp.Context) -> None:
        ctx.step("boom", lambda: 1 / 0)

    with pytest.raises(cp.RunFailed):
        ledger.run(fails, run_id="failed-1")
    time.sleep(0.6)  # the killed run's lease runs out
    with TestClient(
        create_app(ConsoleConfig(ledger=ledger)), base_url="http://127.0.0.1:8765"
    ) as c:
        yield c
    ledger.close()


def test_a_killed_runs_page_shows_its_owner_and_its_expired_lease(client: TestClient) -> None:
    page = client.get("/run?id=killed-1")
    assert page.status_code == 200
    assert ">running<" in page.text
    owner = page.text.split('id="owner">')[1].split("</td>")[0]
    assert "fencing token" in owner
    lease = page.text.split('id="lease">')[1].split("</td>")[0]
    assert "expired at" in lease
    assert "takes it over" in lease


def test_needs_attention_lists_the_abandoned_and_the_failed_run(client: TestClient) -> None:
    page = client.get("/attention")
    assert page.status_code == 200
    abandoned = page.text.split('id="abandoned"')[1].split("</table>")[0]
    assert ">killed-1</a>" in abandoned
    assert "died or stalled" in abandoned
    frozen = page.text.split('id="frozen"')[1].split("</table>")[0]
    assert ">failed-1</a>" in frozen
    assert 'data-count="abandoned">abandoned: 1' in page.text
    assert 'data-count="failed">failed: 1' in page.text


def test_the_timeline_marks_the_crash_and_the_resume(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url], env=os.environ.copy(), capture_output=True, timeout=60
    )
    assert child.returncode == -9, child.stderr
    ledger = cp.Ledger(url)

    @ledger.workflow("long", version="1")
    def long(ctx: cp.Context) -> None:
        ctx.step("first", lambda: 1)
        ctx.step("die", lambda: None)  # this time it lives

    ledger.resume("killed-1")
    app = create_app(ConsoleConfig(ledger=ledger))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        page = client.get("/run?id=killed-1").text
    ledger.close()
    svg = page.split('<svg id="bars"')[1].split("</svg>")[0]
    assert 'data-step="first"' in svg
    assert 'data-step="die"' in svg
    drives = svg.split('<g class="drive">')[1:]
    assert len(drives) == 2
    assert "started by" in drives[0]
    assert "no outcome: crashed or killed" in drives[0]
    assert "resumed by" in drives[1]
    assert "; outcome" in drives[1]
