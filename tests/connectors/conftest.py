"""The connectors' test parts: a real MCP server on loopback (tests/support/mcp_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.tools import MCP_TOOLS
from orchestrator.agents.clients import breaker_default
from tests.e2e.conftest import procs, pytest_runtest_makereport, side_effects, workers
from tests.support.mcp_server import DocsServer

__all__ = ["procs", "pytest_runtest_makereport", "side_effects", "workers"]


@pytest.fixture
def docs() -> Iterator[DocsServer]:
    server = DocsServer().start()
    yield server
    server.stop()


@pytest.fixture
def keyed_docs() -> Iterator[DocsServer]:
    server = DocsServer(key="sekrit").start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_tools() -> Iterator[None]:
    """Each test sees the servers it registered at once, and no breaker of an earlier test."""
    MCP_TOOLS.invalidate()
    yield
    MCP_TOOLS.invalidate()
    store = breaker_default().store
    for name in ("docs", "gone", "keyed"):
        store.clear(f"mcp-server:{name}")  # type: ignore[attr-defined]
