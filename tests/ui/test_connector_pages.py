"""The Connectors pages: every role sees the registered MCP servers and their tools (the name
each is offered as, its effect); an admin registers one (its tools are listed at once against a
real MCP server on loopback) and tests the connection again; problems at their fields."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from connectors.models import McpServer
from connectors.services import mcp_server_create
from tests.support.mcp_server import DocsServer

pytestmark = pytest.mark.django_db(transaction=True)
ClientAs = Callable[[str], Client]


@pytest.fixture
def docs() -> Iterator[DocsServer]:
    server = DocsServer().start()
    yield server
    server.stop()


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:2000]
    return html.unescape(response.content.decode())


def test_an_admin_registers_a_server_and_sees_its_tools(
    client_as: ClientAs, docs: DocsServer
) -> None:
    admin = client_as("admin")
    form = {"name": "docs", "url": docs.url, "transport": "streamable_http",
            "headers": "", "timeout_seconds": "30", "tools_filter": "search, delete_page"}  # fmt: skip
    response = admin.post("/connectors", form, follow=True)
    text = page(response)
    assert "docs: 7 tools listed." in text
    assert (
        "<code>mcp__docs__search</code>" in text and "<code>mcp__docs__delete_page</code>" in text
    )
    assert "not offered (tools filter)" in text  # add_note and the rest
    assert McpServer.objects.get(name="docs").tools_filter == ["search", "delete_page"]

    docs.stop()
    refreshed = page(admin.post("/connectors/docs/refresh", follow=True))
    assert "The last listing failed" in refreshed and "mcp__docs__search" in refreshed


def test_readers_see_servers_but_only_admins_register_or_refresh(
    client_as: ClientAs, docs: DocsServer
) -> None:
    mcp_server_create(name="docs", url=docs.url, headers={"X-Key": "LOOPWRIGHT_SECRET_UNSET_X"})
    viewer = client_as("viewer")
    listing = page(viewer.get("/connectors"))
    assert 'id="connector-docs"' in listing and "Register an MCP server" not in listing
    detail = page(viewer.get("/connectors/docs"))
    assert "LOOPWRIGHT_SECRET_UNSET_X" in detail and "not set" in detail
    assert "Test the connection" not in detail
    assert viewer.post("/connectors/docs/refresh").status_code == 403
    assert client_as("operator").post("/connectors", {"name": "x"}).status_code == 403
    assert page(client_as("viewer").get("/connectors/nope"), 404)


def test_problems_are_shown_at_their_fields(client_as: ClientAs) -> None:
    admin = client_as("admin")
    form = {"name": "meta", "url": "http://169.254.169.254/mcp", "transport": "streamable_http",
            "headers": "X-Key: DATABASE_URL", "timeout_seconds": "30", "tools_filter": ""}  # fmt: skip
    text = page(admin.post("/connectors", form), 400)
    assert "refused" in text
    assert not McpServer.objects.exists()
    bad_line = {**form, "url": "http://127.0.0.1:9/mcp", "headers": "no colon here"}
    assert "write Header-Name: VARIABLE" in page(admin.post("/connectors", bad_line), 400)
