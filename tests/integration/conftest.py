"""Fixtures shared by the integration tests of the HTTP tool, approvals and reviews."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crashproof.tools.http import HttpTool

from .http_child import make_tool
from .http_server import IdempotentServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[IdempotentServer]:
    """A real HTTP target on loopback that dedupes by Idempotency-Key."""
    srv = IdempotentServer(tmp_path / "server.json").start()
    yield srv
    srv.stop()


@pytest.fixture
def tool(server: IdempotentServer) -> Iterator[HttpTool]:
    """The HTTP tool pointed at ``server``."""
    with make_tool(server.url) as t:
        yield t
