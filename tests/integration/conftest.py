"""Fixtures shared by the integration tests of the HTTP tool, approvals and reviews, and
the real small disk of the tests of the machine failing under a tool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crashproof.tools.http import HttpTool

from .disks import small_disk_at
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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB filesystem (tmpfs) that fills up as a disk does: ENOSPC."""
    with small_disk_at(tmp_path / "disk") as mount:
        yield mount
