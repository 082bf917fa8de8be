"""Idempotency windows with a real crash (#27): a child process is killed by SIGKILL
between an act's intent and its effect, or between its effect and its receipt, against
a real HTTP target that forgets keys ``FORGET`` seconds after they were used. Resumed in
this process:

- inside the tool's window, a "not found" is trusted: the act is executed once;
- past it, "not found" may be a forgotten key: the run freezes in ``needs_review`` with
  the intent's time, the lookup's time and the window as evidence, and nothing is sent
  again (before, a forgotten key was a second charge).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import crashproof as cp

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from http_server import IdempotentServer

CHILD = """
import sys
from datetime import timedelta

import crashproof as cp
from crashproof.tools.http import HttpTool


@cp.workflow("pay", version="1")
def pay(ctx, url, window):
    tool = HttpTool(
        url,
        "/resources",
        lookup_path="/resources/by-key/{operation_id}",
        idempotency_window=timedelta(seconds=window),
    )
    return ctx.act("charge", tool, body={"amount": 5})["id"]


if __name__ == "__main__":
    points = cp.CrashPoints(match=sys.argv[2], action="sigkill")
    cp.Ledger(f"sqlite:///{sys.argv[1]}", crash_points=points).run(
        pay, run_id="A", url=sys.argv[3], window=float(sys.argv[4])
    )
"""

INTENT = "after_commit[act_intent:charge]"  # an intent, nothing sent
EFFECT = "before_commit[step_done:charge]"  # charged, no receipt journaled
FORGET = 1.0  # the target forgets a key this long after it was used
WINDOW = 1.0  # what the tool declares


def _crash(tmp_path: Path, server: IdempotentServer, point: str, window: float) -> Path:
    db, child = tmp_path / "l.db", tmp_path / "child.py"
    child.write_text(CHILD, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(child), str(db), point, server.url, str(window)],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    return db


def _ledger(db: Path) -> cp.Ledger:
    """A new ledger that knows the child's workflow (its code, loaded here too)."""
    namespace: dict[str, Any] = {"__name__": "pay_child"}
    exec(compile(CHILD, "pay_child", "exec"), namespace)
    ledger = cp.Ledger(f"sqlite:///{db}")
    ledger.register(namespace["pay"])
    return ledger


@pytest.mark.parametrize("point", [INTENT, EFFECT])
def test_inside_the_window_not_found_is_executed_once(tmp_path: Path, point: str) -> None:
    with IdempotentServer(tmp_path / "t.json", forget_after=FORGET) as server:
        db = _crash(tmp_path, server, point, window=60.0)  # a window longer than the wait
        with _ledger(db) as ledger:
            assert ledger.resume("A").startswith("res-")
        assert server.creates() == 1  # looked up (found, or not found and sent once)


def test_past_the_window_a_forgotten_key_freezes_and_nothing_is_sent(tmp_path: Path) -> None:
    with IdempotentServer(tmp_path / "t.json", forget_after=FORGET) as server:
        db = _crash(tmp_path, server, EFFECT, window=WINDOW)
        assert server.creates() == 1
        time.sleep(max(FORGET, WINDOW) + 0.5)  # the target forgets the key
        posts = server.total_requests()
        forgot = pytest.raises(cp.RunFrozen, match="the target may have forgotten the key")
        with _ledger(db) as ledger, forgot:
            ledger.resume("A")
        assert server.creates() == 1  # not charged twice
        sent = [r for r in server.requests()[posts:] if r["method"] == "POST"]
        assert sent == []
        shown = _show(db)
        assert shown["status"] == "needs_review"
        window = _freeze_evidence(shown)["idempotency_window"]
        assert window["window_seconds"] == WINDOW
        assert window["intent_age_seconds"] > WINDOW
        assert window["lookup_at"] - window["intent_at"] == window["intent_age_seconds"]


def test_past_the_window_an_intent_never_sent_freezes_too(tmp_path: Path) -> None:
    """Nothing was sent, but the runtime cannot tell that from a forgotten key."""
    with IdempotentServer(tmp_path / "t.json", forget_after=FORGET) as server:
        db = _crash(tmp_path, server, INTENT, window=WINDOW)
        time.sleep(WINDOW + 0.5)
        with _ledger(db) as ledger, pytest.raises(cp.RunFrozen, match=r"window 1\.0 s"):
            ledger.resume("A")
        assert server.creates() == 0


def _show(db: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "crashproof", "show", "A", "--json", "--db", f"sqlite:///{db}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    shown: dict[str, Any] = json.loads(out.stdout)
    return shown


def _freeze_evidence(shown: dict[str, Any]) -> dict[str, Any]:
    assert "the target may have forgotten the key" in shown["reason"], shown["reason"]
    evidence: dict[str, Any] = shown["evidence"]
    return evidence


def test_a_hung_lookup_is_an_unknown_not_a_crash(tmp_path: Path) -> None:
    """Killed between intent and effect; on resume every lookup hangs past the tool's
    timeout: each counts as an unknown outcome, the run stops resumable (``stopped``,
    "unavailable:...: lookup unavailable") with a clear reason, nothing is sent, and a
    later resume finishes it."""
    with IdempotentServer(tmp_path / "t.json", forget_after=FORGET) as server:
        db = _crash(tmp_path, server, INTENT, window=60.0)
        server.arm(hang_lookups=100, sleep_seconds=3.0)
        namespace: dict[str, Any] = {"__name__": "pay_child"}
        exec(compile(CHILD.replace("window),", "window), timeout=0.3,"), "c", "exec"), namespace)
        began = time.monotonic()
        with cp.Ledger(f"sqlite:///{db}") as ledger:
            ledger.register(namespace["pay"])
            with pytest.raises(cp.RunStopped, match="lookup unavailable"):
                ledger.resume("A")
        assert time.monotonic() - began < 20  # bounded: attempts x timeout + backoff
        assert server.creates() == 0
        shown = _show(db)
        assert shown["budget"]["unknowns"] >= 2, shown["budget"]
        assert "ReadTimeout" in json.dumps(shown["evidence"]["lookup_errors"])
        server.arm(hang_lookups=0)
        with _ledger(db) as ledger:
            assert ledger.resume("A").startswith("res-")
        assert server.creates() == 1
        assert _show(db)["budget"]["unknowns"] == shown["budget"]["unknowns"]


ASYNC_CHILD = """
import asyncio, sys
from datetime import timedelta

import crashproof as cp
from crashproof.tools.http_async import AsyncHttpTool


@cp.workflow("pay", version="1")
async def pay(ctx, url, window):
    tool = AsyncHttpTool(
        url,
        "/resources",
        lookup_path="/resources/by-key/{operation_id}",
        idempotency_window=timedelta(seconds=window),
    )
    return (await ctx.act("charge", tool, body={"amount": 5}))["id"]


if __name__ == "__main__":
    points = cp.CrashPoints(match=sys.argv[2], action="sigkill")
    with cp.Ledger(f"sqlite:///{sys.argv[1]}", crash_points=points) as ledger:
        asyncio.run(ledger.run_async(pay, run_id="A", url=sys.argv[3], window=float(sys.argv[4])))
"""


@pytest.mark.parametrize("window", [60.0, WINDOW])
def test_the_async_shell_keeps_the_window_too(tmp_path: Path, window: float) -> None:
    import asyncio

    with IdempotentServer(tmp_path / "t.json", forget_after=FORGET) as server:
        db, child = tmp_path / "l.db", tmp_path / "child.py"
        child.write_text(ASYNC_CHILD, encoding="utf-8")
        argv = [sys.executable, str(child), str(db), EFFECT, server.url, str(window)]
        done = subprocess.run(argv, capture_output=True, timeout=120)
        assert done.returncode == -9, done.stderr.decode()[-2000:]
        time.sleep(FORGET + 0.5)  # the target forgets the key
        namespace: dict[str, Any] = {"__name__": "pay_async_child"}
        exec(compile(ASYNC_CHILD, "pay_async_child", "exec"), namespace)
        with cp.Ledger(f"sqlite:///{db}") as ledger:
            ledger.register(namespace["pay"])
            if window > FORGET:  # the tool over-states its window: the old behaviour
                assert asyncio.run(ledger.resume_async("A")).startswith("res-")
                assert server.creates() == 2  # the duplicate a declared window prevents
            else:
                with pytest.raises(cp.RunFrozen, match="may have forgotten the key"):
                    asyncio.run(ledger.resume_async("A"))
                assert server.creates() == 1
