"""Registering MCP servers, and reading their tool lists (``tools/list``).

A registration is saved whatever the server answers; its tools are then listed at once (the
connection test) and stored with what each is offered as. A listing that fails keeps the tools
listed before and records why (``list_error``): the tools of a server that is down for a while
stay offered, and their calls fail as tool errors (docs/interop.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypeVar

from django.db import models
from django.utils import timezone

from connectors.mcp_client import RemoteTool, ServerAccess, list_tools
from connectors.models import McpServer
from connectors.naming import offered_name
from orchestrator.errors import NotFound, full_clean_or_invalid, invalid_fields
from runtime.secrets import SecretNotAllowed, api_key_from_env, current_secret_rule

logger = logging.getLogger(__name__)
Row = TypeVar("Row", bound=models.Model)
EDITABLE = ("url", "transport", "headers", "timeout_seconds", "tools_filter", "enabled")


def mcp_server_get(name: str) -> McpServer:
    server = McpServer.objects.filter(name=name).first()
    if server is None:
        raise NotFound(f"No MCP server named {name!r}.")
    return server


def mcp_server_create(*, name: str, **fields: Any) -> McpServer:
    """Register a server (checked by the outbound guard and the secret rule) and list its
    tools."""
    server = McpServer(name=name, **fields)
    full_clean_or_invalid(server)
    server.save()
    return mcp_server_refresh(server)


def mcp_server_update(*, server: McpServer, **fields: Any) -> McpServer:
    """Change the given fields (not the name: tool names and harness layers carry it) and list
    the tools again."""
    return mcp_server_refresh(row_update(server, fields, EDITABLE))


def row_update(row: Row, fields: dict[str, Any], editable: tuple[str, ...]) -> Row:
    """Set ``row``'s ``editable`` fields among ``fields``, validate and save them; a changed
    ``name`` is refused (tool names and harness layers carry it)."""
    if "name" in fields and fields["name"] != getattr(row, "name", None):
        raise invalid_fields(
            [{"pointer": "/name", "detail": "The name cannot change.", "code": "invalid"}]
        )
    changed = [field for field in fields if field in editable]
    for field in changed:
        setattr(row, field, fields[field])
    full_clean_or_invalid(row)
    row.save(update_fields=[*changed, "updated_at"])
    return row


def mcp_server_delete(*, server: McpServer) -> None:
    server.delete()


def server_access(server: McpServer) -> ServerAccess | str:
    """How to reach ``server`` now (its header values read from their environment variables),
    or why it cannot be reached."""
    headers = header_values(server.headers or {})
    if isinstance(headers, str):
        return headers
    return ServerAccess(
        name=server.name,
        url=server.url,
        transport="sse" if server.transport == "sse" else "streamable_http",
        timeout_seconds=float(server.timeout_seconds),
        headers=headers,
    )


def header_values(headers: dict[str, str]) -> dict[str, str] | str:
    """Each header's value read from its environment variable now, or why one cannot be."""
    values: dict[str, str] = {}
    for header, variable in headers.items():
        try:
            value = api_key_from_env(variable, rule=current_secret_rule())
        except SecretNotAllowed as exc:
            return f"header {header}: {exc}"
        if value is None:
            return f"header {header}: the environment variable {variable} is not set"
        values[header] = value.reveal()
    return values


def listed_entry(server: str, tool: RemoteTool) -> dict[str, Any]:
    """How a listed tool is stored: as the server gave it, and what it is offered as (or why
    it is not)."""
    offered = offered_name(server, tool.name)
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "annotations": tool.annotations,
        "offered_as": offered,
        "skipped": ""
        if offered
        else "its name cannot be offered as mcp__<server>__<tool> "
        "(at most 64 letters, digits, _ or - in all)",
    }


def mcp_server_refresh(server: McpServer) -> McpServer:
    """List the server's tools now and store them; a failure is recorded in ``list_error``
    (the earlier list is kept). Not for an event loop's thread."""
    access = server_access(server)
    try:
        if isinstance(access, str):
            raise ValueError(access)
        listed = asyncio.run(asyncio.wait_for(list_tools(access), access.timeout_seconds))
    except Exception as exc:
        server.list_error = failure_reason(exc)
        logger.warning("MCP server %s: tools/list failed: %s", server.name, server.list_error)
        server.save(update_fields=["list_error"])
        return server
    server.tools = [listed_entry(server.name, tool) for tool in listed]
    server.tools_listed_at = timezone.now()
    server.list_error = ""
    server.save(update_fields=["tools", "tools_listed_at", "list_error"])
    return server


def mcp_server_refresh_by_name(name: str) -> None:
    """:func:`mcp_server_refresh` of server ``name`` if it is still registered."""
    server = McpServer.objects.filter(name=name).first()
    if server is not None:
        mcp_server_refresh(server)


def failure_reason(exc: BaseException) -> str:
    """The innermost useful message of ``exc`` (task groups wrap transport errors)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "the server did not answer in time"
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"[:500]
