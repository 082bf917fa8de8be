"""A small stdio MCP server for the pydantic-ai MCP tests (the ``mcp`` SDK's
``MCPServer``, ``FastMCP`` before mcp 2), run as a child process by ``MCPToolset``.

Everything it is asked is appended to ``$MCP_LOG`` (``start``, ``list_tools``,
``call:<tool>``), so a test counts what reached the server across processes; ``bump``
also appends to ``$MCP_EFFECTS`` (its side effect). ``$MCP_EXTRA=1`` offers one more
tool (a server whose tool list changed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

try:
    from mcp.server.mcpserver import MCPServer  # mcp 2.x
except ImportError:  # mcp 1.x, where it is FastMCP
    from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[no-redef]

LOG = Path(os.environ["MCP_LOG"])
EFFECTS = Path(os.environ["MCP_EFFECTS"])


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


class CountingServer(MCPServer):
    async def list_tools(self) -> Any:
        _append(LOG, "list_tools")
        return await super().list_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any], *args: Any, **kw: Any) -> Any:
        _append(LOG, f"call:{name}")
        return await super().call_tool(name, arguments, *args, **kw)


server = CountingServer("counter")


@server.tool()
def bump(by: int) -> int:
    """Add ``by`` to the counter (a side effect); returns the number of bumps so far."""
    _append(EFFECTS, str(by))
    return len(EFFECTS.read_text().splitlines())


@server.tool()
def double(n: int) -> int:
    """Twice ``n`` (pure)."""
    return 2 * n


if os.environ.get("MCP_EXTRA") == "1":

    @server.tool()
    def extra(s: str) -> str:
        """A tool the first listing did not offer."""
        return s


if __name__ == "__main__":
    _append(LOG, "start")
    server.run("stdio")
