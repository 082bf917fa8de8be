"""MCP servers under ``CrashproofDurability``: their tool listing journaled, their
connection opened only when something has to be asked of them.

Wrapped as pydantic-ai's own DBOS and Temporal engines wrap an ``MCPToolset``
(``get_wrapper_toolset``, each ``MCPToolset`` leaf replaced; its ``id`` names its
steps):

- ``get_tools`` is one ``ctx.step("<agent>:mcp/<id>:list_tools", ...)`` whose value is
  the server's tool definitions, in the server's order. With ``cache_tools`` (pydantic-ai's
  default) the first listing serves the whole agent run, as the engines' per-run cache
  does; with ``cache_tools=False`` every run step lists again (numbered ``#2``, ...).
  A replayed listing is the recorded one: the server is not asked, so a resumed run
  offers the model exactly the tools it was offered before the crash.
- ``call_tool`` goes through the capability's ``wrap_tool_execute`` like any tool (a
  step, or an act when the server's tools are marked ``EFFECT`` with
  ``server.with_metadata(**EFFECT)``, under ``functions="effect"``, or given as a
  ``cp.Tool``); a replayed call never reaches this toolset.
- The server is entered (a stdio child started, an HTTP session opened) the first time
  a listing or a call is made live, and left at the end of the run: a run that only
  replays never starts it.

The listings of several servers are taken one at a time, in the order pydantic-ai asks
for them (its ``CombinedToolset`` starts them in the agent's toolset order), so the
journal's order is the same on every drive.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any, Self

from pydantic import TypeAdapter
from pydantic_ai.exceptions import UserError
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset

import crashproof as cp
from crashproof.integrations.pydantic_ai._bridge import bound, ctx_call
from crashproof.integrations.pydantic_ai._codec import to_json


def _mcp_toolset_class() -> type[Any] | None:
    """pydantic-ai's ``MCPToolset``, if the agent's code imported it: an agent with an
    MCP server made one, so an agent without does not pay for importing the MCP stack
    (fastmcp, over a second) when the integration is imported."""
    module = sys.modules.get("pydantic_ai.mcp")
    return getattr(module, "MCPToolset", None) if module is not None else None


__all__ = ["JournaledMCPToolset", "journal_mcp"]

_DEFS: TypeAdapter[list[ToolDefinition]] = TypeAdapter(list[ToolDefinition])


@dataclass
class _RunListings:
    """Per agent run: the listings already taken (by server id, under ``cache_tools``)
    and the lock that takes them one at a time."""

    agent: str
    cached: dict[str, list[ToolDefinition]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class JournaledMCPToolset(WrapperToolset[AgentDepsT]):
    """One MCP server of a durable agent run (see the module's docstring)."""

    listings: _RunListings = field(kw_only=True)
    _entered: bool = field(default=False, init=False, repr=False)

    @property
    def _server(self) -> Any:
        return self.wrapped

    @property
    def id(self) -> str | None:
        return self.wrapped.id

    def _ctx(self) -> cp.Context | cp.AsyncContext:
        ctx = bound()
        if ctx is None:
            raise UserError(
                f"agent {self.listings.agent!r}: MCP server {self.id!r} asked outside a "
                "crashproof workflow: run the agent inside `with durable(ctx):`. Nothing was sent"
            )
        return ctx

    async def _enter(self) -> None:
        """Connect, once per run; a server that cannot be reached is ``cp.Unavailable``
        (nothing was sent: the run stops resumable, and the next drive connects again)."""
        if self._entered:
            return
        try:
            await self.wrapped.__aenter__()
        except UserError:
            raise
        except Exception as exc:
            raise cp.Unavailable(f"MCP server {self.id!r} could not be reached: {exc}") from exc
        self._entered = True

    async def __aenter__(self) -> Self:
        return self  # entered on first live use (_enter), never for a replay

    async def __aexit__(self, *args: Any) -> bool | None:
        if not self._entered:
            return None
        self._entered = False
        return await self.wrapped.__aexit__(*args)

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        server = self._server
        server_id = str(self.id)
        run_ctx = self._ctx()
        async with self.listings.lock:  # acquired in call order: the journal's order
            defs = self.listings.cached.get(server_id) if server.cache_tools else None
            if defs is None:

                async def list_tools(server: str) -> list[Any]:
                    await self._enter()
                    tools = await self.wrapped.get_tools(ctx)
                    return [to_json(tool.tool_def) for tool in tools.values()]

                name = f"{self.listings.agent}:mcp/{server_id}:list_tools"
                record = await ctx_call(run_ctx, "step", name, list_tools, server=server_id)
                if not isinstance(record, list):
                    raise cp.CrashproofError(f"{name} recorded {record!r}, not a tool list")
                defs = _DEFS.validate_python(record)
                if server.cache_tools:
                    self.listings.cached[server_id] = defs
        return {d.name: server.tool_for_tool_def(d, ctx=ctx) for d in defs}

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        # Reached only from wrap_tool_execute's handler: the call is being made live.
        await self._enter()
        return await self.wrapped.call_tool(name, tool_args, ctx, tool)


def journal_mcp(agent: str, toolset: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
    """``toolset`` with each ``MCPToolset`` leaf journaled (a fresh per-run state)."""
    mcp_toolset = _mcp_toolset_class()
    if mcp_toolset is None:  # no MCP server in this process (or no pydantic-ai-slim[mcp])
        return toolset
    listings = _RunListings(agent)
    seen: set[str] = set()

    def wrap(leaf: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
        if not isinstance(leaf, mcp_toolset):
            return leaf
        server_id = leaf.id
        if not server_id or "#" in server_id:
            raise UserError(
                f"agent {agent!r}: {leaf.label} needs an id (MCPToolset(..., id='...'), no '#'): "
                "it names the server's journaled steps, so it must not change between a "
                "crash and its resume. Nothing was sent"
            )
        if server_id in seen:
            raise UserError(f"agent {agent!r}: two MCP servers share the id {server_id!r}")
        if leaf.include_instructions:
            raise UserError(
                f"agent {agent!r}: MCP server {server_id!r} has include_instructions=True; "
                "its instructions are not journaled under CrashproofDurability, so a "
                "replay could not give them again. Nothing was sent"
            )
        seen.add(server_id)
        return JournaledMCPToolset(leaf, listings=listings)

    return toolset.visit_and_replace(wrap)
