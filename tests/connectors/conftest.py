"""The connectors' test parts: a real MCP server on loopback (tests/support/mcp_server.py) and a
real A2A agent (tests/support/a2a_agent.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.a2a_tools import A2A_TOOLS
from connectors.tools import MCP_TOOLS
from orchestrator.agents.clients import breaker_default
from tests.e2e.conftest import procs, pytest_runtest_makereport, side_effects, workers
from tests.support.a2a_agent import AgentLog, a2a_agent
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
    A2A_TOOLS.invalidate()
    yield
    MCP_TOOLS.invalidate()
    A2A_TOOLS.invalidate()
    store = breaker_default().store
    for name in ("docs", "gone", "keyed"):
        store.clear(f"mcp-server:{name}")  # type: ignore[attr-defined]
    for name in ("helper", "polled", "gone"):
        store.clear(f"a2a-agent:{name}")  # type: ignore[attr-defined]


@pytest.fixture
def helper_agent() -> Iterator[tuple[str, AgentLog]]:
    """A streaming A2A agent: ``(base URL, what it saw)``."""
    with a2a_agent(streaming=True) as found:
        yield found


@pytest.fixture
def polled_agent() -> Iterator[tuple[str, AgentLog]]:
    """An A2A agent whose card says it does not stream (followed by ``tasks/get``)."""
    with a2a_agent(streaming=False) as found:
        yield found
