"""MCP servers under ``CrashproofDurability``, against a real stdio MCP server
(``mcp_server.py``) driven by pydantic-ai's ``MCPToolset``: the tool listing and each
call are journaled, a resumed or replayed run does not contact the server for what is
recorded, and a changed server configuration under a live run freezes it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import UserError
from pydantic_ai.models.test import TestModel

import crashproof as cp
from crashproof.integrations.pydantic_ai import CrashproofDurability, durable

from .mcp_agents import lines, make_agent, server
from .pyd_agents import drive, workflow

pytestmark = pytest.mark.timeout(120)

MODES = ["sync", "async"]
FIRST_RUN = ["start", "list_tools", "call:bump", "call:double"]


@pytest.mark.parametrize("mode", MODES)
def test_the_listing_and_the_calls_are_journaled_and_a_replay_never_starts_the_server(
    mode: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path), mode)
        assert drive(ledger, wf, mode, prompt="go") == "done with bump,double"
        steps = [(s.key, s.kind.value) for s in ledger.get_run("r").steps]
    assert steps == [
        ("counter:mcp/counter:list_tools", "step"),
        ("counter:model_request", "decide"),
        ("counter:model_request/0:bump", "step"),
        ("counter:model_request/1:double", "step"),
        ("counter:model_request#2", "decide"),
    ]
    assert lines(tmp_path / "server.log") == FIRST_RUN  # one listing serves the agent run
    with cp.Ledger(url) as ledger:  # another process replays the completed run
        wf = workflow(ledger, make_agent(tmp_path), mode)
        assert drive(ledger, wf, mode, prompt="go") == "done with bump,double"
    assert lines(tmp_path / "server.log") == FIRST_RUN  # not even started again
    assert lines(tmp_path / "effects") == ["3"]
    assert len(lines(tmp_path / "asked")) == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_resumed_run_asks_the_server_nothing_it_recorded(mode: str, tmp_path: Path) -> None:
    """Crashed in the second model request, resumed in the other kind of workflow in
    another process, with the server now offering one more tool: the resumed run is
    offered the recorded list (the request it asks again is the one the crash lost),
    and the server is neither listed nor called again."""
    other = "async" if mode == "sync" else "sync"
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, crash_on_request=2), mode)
        with pytest.raises(cp.SimulatedCrash):
            drive(ledger, wf, mode, prompt="go")
    assert lines(tmp_path / "server.log") == FIRST_RUN
    changed = server(tmp_path, extra=True)
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, toolset=changed), other)
        assert drive(ledger, wf, other, prompt="go") == "done with bump,double"
    assert lines(tmp_path / "server.log") == FIRST_RUN
    assert lines(tmp_path / "effects") == ["3"]
    assert lines(tmp_path / "asked") == ["1 bump,double", "3 bump,double", "3 bump,double"]
    # a new run lists the server as it is now
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, toolset=server(tmp_path, extra=True)), mode)
        if mode == "sync":
            out = ledger.run(wf, run_id="r2", prompt="go")
        else:
            out = asyncio.run(ledger.run_async(wf, run_id="r2", prompt="go"))
    assert out == "done with bump,double,extra"


def test_a_renamed_server_under_a_live_run_freezes_it(tmp_path: Path) -> None:
    """The server's id names its steps: a run resumed by code that names it otherwise
    is a non-determinism, frozen for review with nothing sent to the server or model."""
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, crash_on_request=2), "sync")
        with pytest.raises(cp.SimulatedCrash):
            drive(ledger, wf, "sync", prompt="go")
    renamed = server(tmp_path, id="tally")
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, toolset=renamed), "sync")
        with pytest.raises(cp.RunFrozen) as frozen:
            drive(ledger, wf, "sync", prompt="go")
    assert frozen.value.status == "needs_review"
    assert isinstance(frozen.value.cause, cp.NonDeterminismError)
    assert lines(tmp_path / "server.log") == FIRST_RUN
    assert lines(tmp_path / "asked") == ["1 bump,double", "3 bump,double"]


def test_without_cache_tools_every_run_step_lists_the_server(tmp_path: Path) -> None:
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        uncached = server(tmp_path, cache_tools=False)
        wf = workflow(ledger, make_agent(tmp_path, toolset=uncached), "sync")
        assert drive(ledger, wf, "sync", prompt="go") == "done with bump,double"
        keys = [s.key for s in ledger.get_run("r").steps]
    assert keys == [
        "counter:mcp/counter:list_tools",
        "counter:model_request",
        "counter:model_request/0:bump",
        "counter:model_request/1:double",
        "counter:mcp/counter:list_tools#2",
        "counter:model_request#2",
    ]
    assert lines(tmp_path / "server.log").count("list_tools") == 2


# -- call_tool: a step by default, an act when marked an effect -----------------------


def test_a_step_call_whose_record_was_lost_runs_again(tmp_path: Path) -> None:
    """The default: an MCP call is a step, run again when a crash fell between its
    effect and its record (as every step)."""
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match="before_commit[step_done:counter:model_request/0:bump]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        with pytest.raises(cp.SimulatedCrash):
            drive(ledger, wf, "sync", prompt="go")
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        assert drive(ledger, wf, "sync", prompt="go") == "done with bump,double"
    assert lines(tmp_path / "effects") == ["3", "3"]
    # The resumed drive starts the server for the lost call only; the agent's listing is
    # replayed (the MCP client lists once in its new session, after the first call, to
    # check a structured result against the tool's output schema: part of that call).
    log = lines(tmp_path / "server.log")
    assert log[:4] == ["start", "list_tools", "call:bump", "start"]
    assert sorted(log[4:]) == ["call:bump", "call:double", "list_tools"]


@pytest.mark.parametrize(("marked", "mode"), [("metadata", "sync"), ("functions", "async")])
def test_an_effect_call_whose_receipt_was_lost_freezes_instead_of_running_again(
    marked: str, mode: str, tmp_path: Path
) -> None:
    """``server.with_metadata(**EFFECT)`` or ``functions="effect"``: the call is an act
    (its intent committed before the server is called); a crash between the effect
    and its receipt freezes the run for review, and ``bump`` never runs twice."""
    kw = {"effect": True} if marked == "metadata" else {"functions": "effect"}
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = cp.CrashPoints(match="before_commit[step_done:counter:model_request/0:bump]")
    with cp.Ledger(url, crash_points=crash) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, **kw), mode)
        with pytest.raises(cp.SimulatedCrash):
            drive(ledger, wf, mode, prompt="go")
        info = ledger.get_run("r")
        assert [(s.key, s.kind.value) for s in info.steps[2:]] == [
            ("counter:model_request/0:bump", "act")
        ]
        assert info.steps[2].operation_id == "r/counter:model_request/0:bump"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, **kw), mode)
        with pytest.raises(cp.RunFrozen) as frozen:
            drive(ledger, wf, mode, prompt="go")
    assert frozen.value.status == "needs_review"
    assert lines(tmp_path / "effects") == ["3"]
    assert lines(tmp_path / "server.log") == ["start", "list_tools", "call:bump"]


def test_effect_calls_are_acts_and_replay_from_their_receipts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    for _ in range(2):
        with cp.Ledger(url) as ledger:
            wf = workflow(ledger, make_agent(tmp_path, effect=True), "sync")
            assert drive(ledger, wf, "sync", prompt="go") == "done with bump,double"
            kinds = [s.kind.value for s in ledger.get_run("r").steps]
    assert kinds == ["step", "decide", "act", "act", "decide"]
    assert lines(tmp_path / "server.log") == FIRST_RUN
    assert lines(tmp_path / "effects") == ["3"]


# -- refused, with nothing sent ------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"id": None}, "needs an id"), ({"include_instructions": True}, "include_instructions")],
)
def test_a_server_that_cannot_be_journaled_is_refused(
    kw: dict[str, object], match: str, tmp_path: Path
) -> None:
    bad = server(tmp_path, **kw)  # type: ignore[arg-type]
    agent = Agent(TestModel(), name="bad", toolsets=[bad], capabilities=[CrashproofDurability()])
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:

        @ledger.workflow("bad", version="1")
        def run(ctx: cp.Context) -> str:
            with durable(ctx):
                return agent.run_sync("go").output

        with pytest.raises(cp.RunFailed, match=match):
            ledger.run(run, run_id="r")
    assert lines(tmp_path / "server.log") == []


def test_two_servers_with_one_id_are_refused(tmp_path: Path) -> None:
    twin = server(tmp_path).prefixed("twin")
    agent = make_agent(tmp_path, more=(twin,))
    with cp.Ledger(f"sqlite:///{tmp_path}/runs.db") as ledger:
        wf = workflow(ledger, agent, "sync")
        with pytest.raises(cp.RunFailed, match="share the id 'counter'"):
            drive(ledger, wf, "sync", prompt="go")
    assert lines(tmp_path / "server.log") == []
    assert lines(tmp_path / "asked") == []


def test_an_agent_with_a_server_outside_a_workflow_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="outside a crashproof workflow"):
        make_agent(tmp_path).run_sync("go")
    assert lines(tmp_path / "server.log") == []


# -- several servers, several agent runs ---------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_two_servers_are_listed_in_toolset_order_on_every_drive(mode: str, tmp_path: Path) -> None:
    """A second server (behind ``prefixed``) is journaled too, after the first, in the
    agent's toolset order: a crash and a resume in the other kind of workflow replay
    both listings without a non-determinism."""
    other = "async" if mode == "sync" else "sync"
    (tmp_path / "tally").mkdir()

    def agent(crash_on_request: int | None = None) -> Agent[None, str]:
        tally = server(tmp_path / "tally", id="tally").prefixed("t")
        return make_agent(tmp_path, crash_on_request=crash_on_request, more=(tally,))

    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, agent(crash_on_request=2), mode)
        with pytest.raises(cp.SimulatedCrash):
            drive(ledger, wf, mode, prompt="go")
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, agent(), other)
        assert drive(ledger, wf, other, prompt="go") == "done with bump,double,t_bump,t_double"
        keys = [s.key for s in ledger.get_run("r").steps]
    assert keys[:3] == [
        "counter:mcp/counter:list_tools",
        "counter:mcp/tally:list_tools",
        "counter:model_request",
    ]
    assert lines(tmp_path / "tally" / "server.log") == ["start", "list_tools"]
    assert lines(tmp_path / "server.log") == FIRST_RUN


def test_a_second_agent_run_in_the_workflow_lists_again(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)

    def twice(ctx: cp.Context) -> str:
        with durable(ctx):
            return agent.run_sync("go").output + " / " + agent.run_sync("again").output

    url = f"sqlite:///{tmp_path}/runs.db"
    for _ in range(2):  # the second drive replays it all
        with cp.Ledger(url) as ledger:
            wf = ledger.workflow("twice", version="1")(twice)
            assert ledger.run(wf, run_id="r").count("done with bump,double") == 2
            keys = [s.key for s in ledger.get_run("r").steps]
    assert [k for k in keys if ":mcp/" in k] == [
        "counter:mcp/counter:list_tools",
        "counter:mcp/counter:list_tools#2",
    ]
    assert lines(tmp_path / "server.log").count("list_tools") == 2
    assert lines(tmp_path / "effects") == ["3", "3"]


def test_a_server_that_cannot_be_reached_stops_the_run_resumable(tmp_path: Path) -> None:
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    down = MCPToolset(StdioTransport(sys.executable, ["-c", "raise SystemExit(1)"]), id="counter")
    url = f"sqlite:///{tmp_path}/runs.db"
    with cp.Ledger(url) as ledger:
        wf = workflow(ledger, make_agent(tmp_path, toolset=down), "sync")
        with pytest.raises(cp.CrashproofError):
            drive(ledger, wf, "sync", prompt="go")
        assert ledger.get_run("r").status is not cp.RunStatus.FAILED  # resumable
    assert lines(tmp_path / "asked") == []  # nothing asked without the tool list
    with cp.Ledger(url) as ledger:  # the server is back
        wf = workflow(ledger, make_agent(tmp_path), "sync")
        assert drive(ledger, wf, "sync", prompt="go") == "done with bump,double"
    assert lines(tmp_path / "server.log") == FIRST_RUN


def test_an_agent_without_mcp_does_not_import_the_mcp_stack() -> None:
    """The MCP stack (fastmcp: over a second) is imported by the agent's code when it
    makes a server, never by the integration."""
    code = (
        "import sys, crashproof.integrations.pydantic_ai, pydantic_ai; "
        "print('pydantic_ai.mcp' in sys.modules, 'fastmcp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
