"""SIGKILL a real process at every crash point of the resume that consumes a signed
approval or review decision (before and after the consumption, the intent, the receipt,
the outcome), then resume in this process: the released request reaches the target
exactly once, a quarantined operation id never again, an aborted run fails."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import crashproof as cp
from crashproof.integrity.signing import generate_keypair

from .approval_child import POLICY, make_tool, make_workflow
from .http_server import IdempotentServer

pytestmark = pytest.mark.timeout(120)

CHILD = Path(__file__).parent / "approval_child.py"
RUN = "deploy:1"
KEY = f"{RUN}/create"


def approved(
    root: Path, server: IdempotentServer, points: cp.CrashPoints | None = None
) -> cp.Ledger:
    """A run frozen for approval, approved by a registered approver (not yet resumed)."""
    generate_keypair(root / "alice.pem")
    ledger = cp.Ledger(f"sqlite:///{root / 'l.db'}")
    ledger.register_policy(POLICY)
    with make_tool(server.url) as tool, pytest.raises(cp.RunFrozen):
        ledger.run(make_workflow(tool), run_id=RUN, options=cp.RunOptions(policy=POLICY))
    ledger.add_approver("alice", (root / "alice.pem.pub").read_text())
    ledger.approve(RUN, "create", key=root / "alice.pem")
    return ledger


def resume_points(tmp_path: Path) -> list[str]:
    with IdempotentServer(tmp_path / "ref.json") as server:
        root = tmp_path / "ref"
        root.mkdir()
        ledger = approved(root, server)
        ledger.close()
        points = cp.CrashPoints()
        again = cp.Ledger(f"sqlite:///{root / 'l.db'}", crash_points=points)
        again.register_policy(POLICY)
        with make_tool(server.url) as tool:
            again.register(make_workflow(tool))
            again.resume(RUN)
        again.close()
        assert server.count(KEY, "POST") == 1
    print(f"{len(points.passed)} crash points in the approved resume")
    return points.passed


def test_sigkill_at_every_point_of_the_approved_resume(tmp_path: Path) -> None:
    points = resume_points(tmp_path)
    assert "after_commit[approval_consumed:create]" in points
    assert points.index("after_commit[approval_consumed:create]") < points.index(
        "before_commit[act_intent:create]"
    )
    for n, point in enumerate(points, start=1):
        root = tmp_path / f"n{n}"
        root.mkdir()
        with IdempotentServer(root / "server.json") as server:
            approved(root, server).close()
            code = subprocess.run(
                [sys.executable, str(CHILD), str(root / "l.db"), server.url, RUN, str(n)],
                check=False,
            ).returncode
            assert code == -signal.SIGKILL, point
            ledger = cp.Ledger(f"sqlite:///{root / 'l.db'}")
            ledger.register_policy(POLICY)
            with make_tool(server.url) as tool:
                ledger.register(make_workflow(tool))
                result = ledger.resume(RUN)
            assert result == server.resource(KEY)["id"], point  # type: ignore[index]
            assert server.count(KEY, "POST") == 1, point
            kinds = [e.type.value for e in ledger._store.load_events(RUN)]
            assert kinds.count("approval_consumed") == 1, point
            ledger.close()


def decided(root: Path, server: IdempotentServer, decision: str) -> cp.Ledger:
    """A run frozen on a receipt conflict, with a signed decision (not yet resumed)."""
    generate_keypair(root / "bob.pem")
    server.seed(KEY, "0" * 64, {"name": "someone else"})
    ledger = cp.Ledger(f"sqlite:///{root / 'l.db'}")
    with make_tool(server.url) as tool, pytest.raises(cp.RunFrozen):
        ledger.run(make_workflow(tool), run_id=RUN)
    ledger.add_approver("bob", (root / "bob.pem.pub").read_text())
    (case,) = ledger.review_cases(RUN)
    ledger.decide(case.case_id, decision, key=root / "bob.pem")
    return ledger


@pytest.mark.parametrize("decision", ["replan", "abort"])
def test_sigkill_at_every_point_of_a_decided_resume(tmp_path: Path, decision: str) -> None:
    ref = tmp_path / "ref"
    ref.mkdir()
    with IdempotentServer(ref / "server.json") as server:
        decided(ref, server, decision).close()
        points = cp.CrashPoints()
        ledger = cp.Ledger(f"sqlite:///{ref / 'l.db'}", crash_points=points)
        with make_tool(server.url) as tool:
            ledger.register(make_workflow(tool))
            if decision == "abort":
                with pytest.raises(cp.RunFailed):
                    ledger.resume(RUN)
            else:
                ledger.resume(RUN)
        ledger.close()
    assert "after_commit[review_consumed:create]" in points.passed
    for n, point in enumerate(points.passed, start=1):
        root = tmp_path / f"n{n}"
        root.mkdir()
        with IdempotentServer(root / "server.json") as server:
            decided(root, server, decision).close()
            posts = server.count(KEY, "POST")
            code = subprocess.run(
                [sys.executable, str(CHILD), str(root / "l.db"), server.url, RUN, str(n)],
                check=False,
            ).returncode
            assert code == -signal.SIGKILL, point
            ledger = cp.Ledger(f"sqlite:///{root / 'l.db'}")
            with make_tool(server.url) as tool:
                ledger.register(make_workflow(tool))
                if decision == "abort":
                    with pytest.raises(cp.RunFailed, match="aborted by bob"):
                        ledger.resume(RUN)
                    assert server.count(f"{KEY}@2", "POST") == 0, point
                else:
                    assert ledger.resume(RUN) == server.resource(f"{KEY}@2")["id"], point  # type: ignore[index]
                    assert server.count(f"{KEY}@2", "POST") == 1, point
            assert server.count(KEY, "POST") == posts, point  # quarantined: never sent again
            kinds = [e.type.value for e in ledger._store.load_events(RUN)]
            assert kinds.count("review_consumed") == 1, point
            ledger.close()
