"""Time and versions against the act protocol (#39), each with a real child process
killed by SIGKILL at the window, on SQLite and on PostgreSQL (where the ledger's clock is
the server's). Hosts' clocks are skewed through ``Ledger(clock=...)``, never the
machine's. Every scenario ends refused, frozen with evidence, or with one effect: never
an effect after an approval's expiry, never two.

1. a shared tool's receipt binds the approval but says no commit time: review;
2. an approved act's intent journaled, killed before the effect, resumed after the
   approval expired: frozen ``awaiting_approval``, nothing sent, until a fresh approval;
3. the same resumed on a host whose clock is an hour behind: still refused (SQLite: the
   ledger's clock never goes behind a time it recorded; PostgreSQL: the server's clock);
4. the intent's writer's clock runs ahead, the target forgot the key: not sent again;
5. a new run with the tool's version bumped (same params) meets another run's
   unresolved act: refused, nothing sent (it waits, a retryable stop);
6. a completed act's receipt lost its intent digest at the target: the resume's re-read
   freezes instead of replaying it as done.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.integrity.signing import generate_keypair

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
sys.path.insert(0, str(Path(__file__).parent))
from clock_child import FROZEN, POLICY, SETTINGS, WINDOW, deploy, skewed, tool_for
from http_server import IdempotentServer

pytestmark = pytest.mark.timeout(180)

CHILD = Path(__file__).parent / "clock_child.py"
INTENT = "after_commit[act_intent:create]"  # journaled, nothing sent
SENT = "inside[act:create:responded]"  # the target committed and answered, no receipt
TTL = 2.0  # seconds an approval lives in these tests (real time: PostgreSQL's clock)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'l.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def target(tmp_path: Path) -> Iterator[IdempotentServer]:
    with IdempotentServer(tmp_path / "target.json") as server:
        yield server


def ledger_at(url: str, offset: float = 0.0) -> cp.Ledger:
    ledger = cp.Ledger(url, clock=skewed(offset), act_settings=SETTINGS)
    ledger.register_policy(POLICY)
    return ledger


def child(url: str, server: IdempotentServer, run: str, kind: str, point: str, offset=0.0) -> int:
    done = subprocess.run(
        [sys.executable, str(CHILD), url, server.url, run, kind, point, str(offset)],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode in (-9, FROZEN), done.stderr.decode()[-3000:]
    return done.returncode


def approved(url: str, server: IdempotentServer, tmp_path: Path, kind: str, ttl: float) -> None:
    """Run ``R`` frozen for the approval of its act, approved for ``ttl`` seconds."""
    generate_keypair(tmp_path / "alice.pem")
    with ledger_at(url) as ledger, tool_for(kind, server.url) as tool:
        with pytest.raises(cp.RunFrozen):
            ledger.run(deploy(tool), run_id="R", options=cp.RunOptions(policy=POLICY))
        ledger.add_approver("alice", (tmp_path / "alice.pem.pub").read_text())
        ledger.approve("R", "create", key=tmp_path / "alice.pem", ttl=ttl)


def resume(url: str, server: IdempotentServer, run: str, kind: str, offset: float = 0.0) -> str:
    with ledger_at(url, offset) as ledger, tool_for(kind, server.url) as tool:
        ledger.register(deploy(tool))
        result: str = ledger.resume(run)
        return result


def status(url: str, run: str) -> str:
    with ledger_at(url) as ledger:
        return ledger.get_run(run).status.value


def expire(issued: float) -> None:
    """Sleep until an approval issued at ``issued`` expired, skew included."""
    time.sleep(max(0.0, issued + TTL + SETTINGS.max_clock_skew + 0.2 - time.time()))


def test_1_a_shared_tool_receipt_without_commit_time_goes_to_review(
    url: str, tmp_path: Path
) -> None:
    with IdempotentServer(tmp_path / "t.json", reports_commit_time=False) as server:
        approved(url, server, tmp_path, "shared", ttl=600)
        assert child(url, server, "R", "shared", SENT) == -9
        assert server.count("R/create", "POST") == 1
        with pytest.raises(cp.RunFrozen, match="carries no commit time"):
            resume(url, server, "R", "shared")
        assert status(url, "R") == "needs_review"  # before: succeeded
        assert server.count("R/create", "POST") == 1


@pytest.mark.parametrize("point", [INTENT, "after_commit[approval_consumed:create]"])
def test_2_resumed_after_expiry_an_approved_act_waits_for_a_fresh_approval(
    url: str, target: IdempotentServer, tmp_path: Path, point: str
) -> None:
    issued = time.time()
    approved(url, target, tmp_path, "private", ttl=TTL)
    assert child(url, target, "R", "private", point) == -9
    expire(issued)
    with pytest.raises(cp.RunFrozen, match="expired") as frozen:
        resume(url, target, "R", "private")
    assert frozen.value.status == "awaiting_approval"
    assert target.count("R/create", "POST") == 0  # before: executed after the expiry
    with ledger_at(url) as ledger:  # the evidence: what waits, and the lapsed approval
        evidence = ledger.get_run("R").evidence or {}
    assert evidence["pending_act"]["step"] == "create"
    lapsed = evidence.get("expired_approval") or evidence["refused_approvals"][0]
    assert "expired" in str(lapsed)
    resume_again = pytest.raises(cp.RunFrozen, match="expired")
    with resume_again:  # a resume alone changes nothing
        resume(url, target, "R", "private")
    assert target.count("R/create", "POST") == 0
    with ledger_at(url) as ledger:
        ledger.approve("R", "create", key=tmp_path / "alice.pem", ttl=600)
    assert resume(url, target, "R", "private") == target.resource("R/create")["id"]  # type: ignore[index]
    assert target.count("R/create", "POST") == 1


def test_3_a_host_an_hour_behind_cannot_execute_an_expired_approval(
    url: str, target: IdempotentServer, tmp_path: Path
) -> None:
    issued = time.time()
    approved(url, target, tmp_path, "private", ttl=TTL)
    assert child(url, target, "R", "private", INTENT) == -9  # consumed in time
    expire(issued)
    if url.startswith("sqlite"):
        # SQLite's clock is the hosts', kept monotonic: a record made after the expiry
        # (here another run of this ledger, by a host with a right clock) is the floor
        # a clock stepped back an hour cannot go behind. PostgreSQL needs none.
        frozen = pytest.raises(cp.RunFrozen)
        with ledger_at(url) as ledger, tool_for("plain", target.url) as tool, frozen:
            ledger.run(deploy(tool), run_id="other", options=cp.RunOptions(policy=POLICY))
    # The child would die once the effect answered: it must freeze before sending it.
    assert child(url, target, "R", "private", SENT, offset=-3600.0) == FROZEN
    assert target.count("R/create", "POST") == 0
    assert status(url, "R") == "awaiting_approval"


def test_4_a_writer_clock_ahead_does_not_shorten_the_window(url: str, tmp_path: Path) -> None:
    with IdempotentServer(tmp_path / "t.json", forget_after=WINDOW) as target:
        _window_ahead(url, target)


def _window_ahead(url: str, target: IdempotentServer) -> None:
    # The intent's writer runs 1.2 s ahead; the effect is sent, the child dies.
    assert child(url, target, "W", "windowed", SENT, offset=1.2) == -9
    assert target.creates() == 1
    time.sleep(WINDOW + 0.6)  # the target forgets the key; by the writer's clock, not yet
    with pytest.raises(cp.RunFrozen, match="the target may have forgotten the key"):
        resume(url, target, "W", "windowed")
    assert target.creates() == 1  # before: sent again, two effects


def test_5_a_bumped_tool_version_cannot_step_around_an_unresolved_act(
    url: str, target: IdempotentServer
) -> None:
    assert child(url, target, "A", "plain", INTENT) == -9
    held = pytest.raises(cp.RunStopped, match="holds the same intent")
    with ledger_at(url) as ledger, tool_for("v2", target.url) as tool, held:
        ledger.run(deploy(tool), run_id="B")
    assert target.creates() == 0  # before: B created its own (a duplicate pull request)
    assert resume(url, target, "A", "plain") == target.resource("A/create")["id"]  # type: ignore[index]
    assert target.creates() == 1


def test_6_a_receipt_that_lost_its_intent_digest_fails_the_reread(
    url: str, target: IdempotentServer
) -> None:
    assert child(url, target, "R", "plain", "before_commit[step_done:after]") == -9
    target.lose_digest("R/create")
    with pytest.raises(cp.RunFrozen, match="no longer shows the intent digest"):
        resume(url, target, "R", "plain")
    assert status(url, "R") == "needs_review"
    assert target.creates() == 1
