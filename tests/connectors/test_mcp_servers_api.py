"""``/api/v1/mcp-servers``: registering a real MCP server lists its tools at once (the
connection test), with the name each is offered as and the effect its annotations give;
secrets stay in environment variables; the outbound guard refuses a URL before anything is
stored; a server that is down is reported, its tools kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from connectors.models import McpServer
from tests.support.mcp_server import DocsServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def _register(client: APIClient, **body: Any) -> Any:
    return client.post("/api/v1/mcp-servers", body, format="json")


def test_registering_lists_the_tools_with_their_names_and_effects(
    api_client_for: Callable[[str], APIClient], docs: DocsServer
) -> None:
    admin = api_client_for("admin")
    response = _register(admin, name="docs", url=docs.url)
    assert response.status_code == 201, response.content
    tools = {t["name"]: t for t in response.data["tools"]}
    assert set(tools) == {
        "search", "add_note", "delete_page", "tag_page", "slow_write", "fail", "chart",
    }  # fmt: skip
    assert tools["search"]["offered_as"] == "mcp__docs__search"
    assert [tools[n]["effect"] for n in ("search", "add_note", "delete_page")] == [
        "read", "write", "external",
    ]  # fmt: skip
    assert tools["tag_page"]["idempotent"] is True
    assert tools["search"]["input_schema"]["properties"]["query"]["type"] == "string"
    assert response.data["list_error"] == "" and response.data["tools_listed_at"]

    # Readers see it; only an admin may register or change one.
    assert api_client_for("viewer").get("/api/v1/mcp-servers/docs").status_code == 200
    refused = _register(api_client_for("operator"), name="other", url=docs.url)
    assert refused.status_code == 403

    narrowed = admin.patch("/api/v1/mcp-servers/docs", {"tools_filter": ["search"]}, format="json")
    assert narrowed.status_code == 200, narrowed.content
    offered = [t["name"] for t in narrowed.data["tools"] if t["offered"]]
    assert offered == ["search"]


def test_header_values_come_from_allowed_environment_variables_only(
    api_client_for: Callable[[str], APIClient],
    keyed_docs: DocsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = api_client_for("admin")
    # A server variable, or a value pasted where the variable's name belongs, is refused.
    for variable in ("DATABASE_URL", "sekrit-value"):
        response = _register(
            admin, name="keyed", url=keyed_docs.url, headers={"X-Docs-Key": variable}
        )
        assert response.status_code == 400, response.content
        assert response["content-type"] == "application/problem+json"
    assert not McpServer.objects.exists()

    body = {
        "name": "keyed",
        "url": keyed_docs.url,
        "headers": {"X-Docs-Key": "LOOPWRIGHT_SECRET_DOCS"},
    }
    unset = _register(admin, **body)
    assert unset.status_code == 201
    assert unset.data["headers_configured"] == {"X-Docs-Key": False}
    assert "LOOPWRIGHT_SECRET_DOCS is not set" in unset.data["list_error"]
    assert unset.data["tools"] == []

    monkeypatch.setenv("LOOPWRIGHT_SECRET_DOCS", "sekrit")
    listed = admin.post("/api/v1/mcp-servers/keyed/refresh")
    assert listed.status_code == 200, listed.content
    assert listed.data["list_error"] == "" and len(listed.data["tools"]) == 7
    assert "sekrit" not in listed.content.decode()


def test_the_outbound_guard_refuses_a_url_before_anything_is_stored(
    api_client_for: Callable[[str], APIClient],
) -> None:
    admin = api_client_for("admin")
    for url in ("http://169.254.169.254/mcp", "file:///etc/passwd", "ftp://example.com/mcp"):
        response = _register(admin, name="metadata", url=url)
        assert response.status_code == 400, (url, response.content)
        assert "refused" in response.content.decode() or "valid URL" in response.content.decode()
    bad_name = _register(admin, name="a__b", url="http://127.0.0.1:9/mcp")
    assert bad_name.status_code == 400 and "/name" in bad_name.content.decode()
    assert not McpServer.objects.exists()


def test_a_server_that_is_down_is_reported_and_its_tools_kept(
    api_client_for: Callable[[str], APIClient], docs: DocsServer
) -> None:
    admin = api_client_for("admin")
    assert _register(admin, name="docs", url=docs.url).status_code == 201
    docs.stop()
    listed = admin.post("/api/v1/mcp-servers/docs/refresh")
    assert listed.status_code == 200
    assert listed.data["list_error"]
    assert len(listed.data["tools"]) == 7  # as listed before


def test_unknown_fields_and_bad_values_are_refused_by_name(
    api_client_for: Callable[[str], APIClient], docs: DocsServer
) -> None:
    admin = api_client_for("admin")
    cases = [
        ({"name": "docs", "url": docs.url, "api_key": "x"}, "api_key"),
        ({"name": "docs", "url": docs.url, "timeout_seconds": 0}, "timeout_seconds"),
        ({"name": "docs", "url": docs.url, "transport": "websocket"}, "transport"),
        ({"name": "docs", "url": docs.url, "tools_filter": "search"}, "tools_filter"),
    ]
    for body, field in cases:
        response = _register(admin, **body)
        assert response.status_code == 400, (body, response.content)
        assert field in response.content.decode()
