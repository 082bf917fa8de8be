"""Receipts are re-read before replay (001: the adapter's receipt is the authority, the
ledger's copy a rebuildable cache). Before: a completed act replayed from the journal
without asking the tool, so a receipt deleted or changed at the target replayed as
success. Now every resume looks the completed acts up again before its first live call
(or before recording the outcome), and freezes on anything gone or changed.

Against the real HTTP server on loopback; the crash leaves the first create completed
and the second one not started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

import crashproof as cp
from crashproof.runtime.port import ActSettings
from crashproof.tools.http import HttpTool

from .http_child import make_tool, make_workflow
from .http_server import IdempotentServer

pytestmark = pytest.mark.timeout(30)

RUN = "run"
K1, K2 = f"{RUN}/create", f"{RUN}/create#2"
FAST = ActSettings(retryable_attempts=3, lookup_attempts=2, backoff=0.01)
BEFORE_SECOND = "after_commit[step_done:create]"  # the first create's receipt committed


def _ledger(tmp_path: Path, **kwargs: Any) -> cp.Ledger:
    return cp.Ledger(f"sqlite:///{tmp_path}/l.db", act_settings=FAST, **kwargs)


def _first_done(tmp_path: Path, tool: HttpTool) -> None:
    ledger = _ledger(tmp_path, crash_points=cp.CrashPoints(match=BEFORE_SECOND))
    with pytest.raises(cp.SimulatedCrash):
        ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
    ledger.close()


def _resume(tmp_path: Path, tool: HttpTool) -> Any:
    with _ledger(tmp_path) as ledger:
        return ledger.run(make_workflow(tool), run_id=RUN, names=["a", "b"])


def test_a_receipt_deleted_at_the_target_does_not_replay_as_success(
    tmp_path: Path, server: IdempotentServer, tool: HttpTool
) -> None:
    _first_done(tmp_path, tool)
    server.forget(K1)
    with pytest.raises(cp.RunFrozen, match="no longer holds this effect") as frozen:
        _resume(tmp_path, tool)
    assert frozen.value.status == "needs_review"
    (check,) = (frozen.value.evidence or {})["receipts"]
    assert (check["step"], check["status"]) == ("create", "drifted")
    assert server.count(K1, "POST") == 1  # never re-sent
    assert server.count(K2, "POST") == 0  # and nothing after it ran


def test_a_result_changed_at_the_target_does_not_replay(
    tmp_path: Path, server: IdempotentServer, tool: HttpTool
) -> None:
    _first_done(tmp_path, tool)
    server.edit(K1, {"name": "changed by someone"})
    with pytest.raises(cp.RunFrozen, match="another result"):
        _resume(tmp_path, tool)
    assert server.count(K2, "POST") == 0


def test_an_intact_receipt_is_read_once_and_the_run_goes_on(
    tmp_path: Path, server: IdempotentServer, tool: HttpTool
) -> None:
    _first_done(tmp_path, tool)
    result = _resume(tmp_path, tool)
    assert result["bodies"] == [{"name": "a"}, {"name": "b"}]
    assert (server.count(K1, "POST"), server.count(K1, "GET")) == (1, 1)
    assert (server.count(K2, "POST"), server.count(K2, "GET")) == (1, 0)


def test_a_lookup_that_cannot_answer_freezes_for_a_later_resume(
    tmp_path: Path, server: IdempotentServer, tool: HttpTool
) -> None:
    _first_done(tmp_path, tool)
    server.arm(fail_lookups=10, key=K1)
    with pytest.raises(cp.RunFrozen, match="could not be re-read"):
        _resume(tmp_path, tool)
    assert server.count(K2, "POST") == 0
    server.arm(fail_lookups=0)
    assert _resume(tmp_path, tool)["bodies"] == [{"name": "a"}, {"name": "b"}]


class TrustingHttpTool(HttpTool):
    """Opts out: its receipts are not re-read (the documented risk: a deleted effect
    replays as success from the journal's copy)."""

    reread_receipts: ClassVar[bool] = False


def test_a_tool_that_opts_out_replays_the_journals_copy(
    tmp_path: Path, server: IdempotentServer
) -> None:
    with TrustingHttpTool(
        server.url, "/resources", lookup_path="/resources/by-key/{operation_id}"
    ) as trusting:
        _first_done(tmp_path, trusting)
        server.forget(K1)
        result = _resume(tmp_path, trusting)
    assert result["bodies"] == [{"name": "a"}, {"name": "b"}]
    assert server.count(K1, "GET") == 0


def test_a_finished_run_is_re_read_before_its_outcome_is_recorded(
    tmp_path: Path, server: IdempotentServer, tool: HttpTool
) -> None:
    # The crash comes after the last act: the resume makes no live call at all, so the
    # re-read happens before run_succeeded is recorded.
    crashing = _ledger(tmp_path, crash_points=cp.CrashPoints(match="before_commit[run_succeeded]"))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(make_workflow(tool), run_id=RUN, names=["a", "b"])
    crashing.close()
    server.forget(K2)
    with pytest.raises(cp.RunFrozen, match="no longer holds this effect"):
        _resume(tmp_path, tool)
    with _ledger(tmp_path) as ledger:
        assert ledger.get_run(RUN).status is cp.RunStatus.NEEDS_REVIEW


def test_make_tool_rereads_by_default() -> None:
    with make_tool("http://127.0.0.1:1") as tool:
        assert tool.reread_receipts is True


def _connect(engine: str, target: str) -> Any:
    if engine == "sqlite":
        import sqlite3

        return sqlite3.connect(target)
    import psycopg

    return psycopg.connect(target)


def _database(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh database with table ``t``: a SQLite file, or one on the started PostgreSQL."""
    if engine == "sqlite":
        target = str(tmp_path / "app.db")
    else:
        target = str(request.getfixturevalue("pg_server").create_database())
    conn = _connect(engine, target)
    conn.execute("CREATE TABLE t (v INTEGER)")
    conn.commit()
    conn.close()
    return target


def _rows(engine: str, target: str, sql: str) -> list[Any]:
    conn = _connect(engine, target)
    try:
        rows = conn.execute(sql).fetchall()
        conn.commit()
        return [tuple(row) for row in rows]
    finally:
        conn.close()


def _closing_workflow(engine: str, target: str) -> cp.Workflow[Any]:
    """Acts through a connection the body opens and closes in ``finally``, as a workflow
    is written: after its last act the body returns with the connection closed."""
    from crashproof.tools.sql import Sql

    @cp.workflow("closing", version="1")
    def closing(ctx: cp.Context) -> list[int]:
        conn = _connect(engine, target)
        try:
            a = ctx.act("a", Sql(conn), sql="INSERT INTO t (v) VALUES (1)")
            b = ctx.act("b", Sql(conn), sql="INSERT INTO t (v) VALUES (2)")
        finally:
            conn.close()
        return [a["rows_affected"], b["rows_affected"]]

    return closing


def _crash_at(tmp_path: Path, flow: cp.Workflow[Any], point: str) -> None:
    crashing = _ledger(tmp_path, crash_points=cp.CrashPoints(match=point))
    with pytest.raises(cp.SimulatedCrash):
        crashing.run(flow, run_id=RUN)
    crashing.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
@pytest.mark.parametrize("point", ["after_commit[step_done:b]", "before_commit[run_succeeded]"])
def test_receipts_are_re_read_while_the_body_still_holds_its_tools(
    tmp_path: Path, point: str, engine: str, request: pytest.FixtureRequest
) -> None:
    """Killed after the last act, the resume replays every act and the body returns with
    its connection closed. The receipts are re-read when the journal's last act is
    replayed, not after the body returned (before: PostgreSQL's lookup, which reads
    through the caller's connection, met it closed and the run froze needs_review,
    "could not be re-read"; tests/crash/test_sigkill_sql.py's random kills hit it)."""
    target = _database(engine, tmp_path, request)
    flow = _closing_workflow(engine, target)
    _crash_at(tmp_path, flow, point)
    with _ledger(tmp_path) as ledger:
        assert ledger.run(flow, run_id=RUN) == [1, 1]
        assert ledger.get_run(RUN).status is cp.RunStatus.SUCCEEDED
    assert _rows(engine, target, "SELECT v FROM t ORDER BY v") == [(1,), (2,)]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_receipt_gone_is_still_caught_when_the_last_act_replays(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    """The earlier re-read still freezes on a receipt gone at the target, and the body's
    return is not recorded as the run's success."""
    target = _database(engine, tmp_path, request)
    flow = _closing_workflow(engine, target)
    _crash_at(tmp_path, flow, "after_commit[step_done:b]")
    conn = _connect(engine, target)
    conn.execute("DELETE FROM crashproof_receipts")
    conn.commit()
    conn.close()
    with _ledger(tmp_path) as ledger:
        with pytest.raises(cp.RunFrozen):
            ledger.run(flow, run_id=RUN)
        assert ledger.get_run(RUN).status is cp.RunStatus.NEEDS_REVIEW
