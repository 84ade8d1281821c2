"""The MCP protocol side of a server: list its tools, call one. Plain async code over the
official ``mcp`` SDK's client, every connection through the outbound guard.

A session is opened per listing or call and closed after it (no state kept between calls that a
crash could lose). A ``notifications/tools/list_changed`` seen during a session is reported to
``on_list_changed``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import IncomingMessage
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from runtime import outbound, outbound_http
from runtime.model_pool import ssl_context
from runtime.outbound import OutboundPolicy

#: What a call's answer may hold before it is cut (the loop cuts further for the model).
MAX_RESULT_CHARS = 100_000


@dataclass(frozen=True)
class ServerAccess:
    """How to reach one server now: its URL, transport, timeout and header values."""

    name: str
    url: str
    transport: Literal["streamable_http", "sse"]
    timeout_seconds: float
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class RemoteTool:
    """One entry of a server's ``tools/list``."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]


@dataclass(frozen=True)
class CallAnswer:
    """A ``tools/call`` answer as text for the model; ``is_error`` when the tool failed; its image
    blocks as ``data:`` URLs (the text keeps a placeholder for each)."""

    text: str
    is_error: bool
    images: tuple[str, ...] = ()


def _guarded_client(
    policy: OutboundPolicy, headers: Mapping[str, str], timeout: float, verify: ssl.SSLContext
) -> httpx2.AsyncClient:
    client = outbound_http.async_client(policy, verify=verify)
    client.headers.update(dict(headers))
    client.timeout = httpx2.Timeout(timeout)
    return client


@asynccontextmanager
async def _session(server: ServerAccess, on_list_changed: Callable[[], None] | None) -> Any:
    policy = outbound.current_policy()
    outbound.check_url(server.url, policy)  # static checks; each connection is checked too
    verify = ssl_context()

    async def message_handler(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification) and on_list_changed:
            on_list_changed()

    if server.transport == "sse":

        def factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            return _guarded_client(policy, server.headers, server.timeout_seconds, verify)

        transport: Any = sse_client(
            server.url, timeout=server.timeout_seconds, httpx_client_factory=factory
        )
        async with Client(transport, message_handler=message_handler) as client:
            yield client
        return
    http = _guarded_client(policy, server.headers, server.timeout_seconds, verify)
    async with http:
        transport = streamable_http_client(server.url, http_client=http)
        async with Client(transport, message_handler=message_handler) as client:
            yield client


async def list_tools(
    server: ServerAccess, on_list_changed: Callable[[], None] | None = None
) -> list[RemoteTool]:
    """Every tool the server lists (all pages)."""
    found: list[RemoteTool] = []
    async with _session(server, on_list_changed) as client:
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            for tool in page.tools:
                hints = tool.annotations
                annotations = hints.model_dump(by_alias=True, exclude_none=True) if hints else {}
                found.append(
                    RemoteTool(
                        name=tool.name,
                        description=tool.description or "",
                        input_schema=dict(tool.input_schema or {"type": "object"}),
                        annotations=annotations,
                    )
                )
            cursor = page.next_cursor
            if not cursor:
                return found


async def call_tool(
    server: ServerAccess,
    name: str,
    arguments: dict[str, Any],
    *,
    meta: dict[str, Any] | None = None,
    on_list_changed: Callable[[], None] | None = None,
) -> CallAnswer:
    """Call ``name`` with ``arguments``; transport and protocol failures raise."""
    async with _session(server, on_list_changed) as client:
        result = await client.call_tool(
            name, arguments, read_timeout_seconds=server.timeout_seconds, meta=meta
        )
    text, images = _text_of(result)
    return CallAnswer(text, bool(result.is_error), images)


def _text_of(result: types.CallToolResult) -> tuple[str, tuple[str, ...]]:
    """The answer's content as text (text blocks as they are, other blocks described, and the
    structured content as JSON when no block carries text) and its images as data URLs."""
    parts: list[str] = []
    images: list[str] = []
    for block in result.content or []:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent) and block.mime_type.startswith("image/"):
            images.append(f"data:{block.mime_type};base64,{block.data}")
            size = len(block.data) * 3 // 4
            parts.append(f"[image {len(images)}: {block.mime_type}, about {size} bytes]")
        elif isinstance(block, types.ImageContent | types.AudioContent):
            size = len(block.data) * 3 // 4
            parts.append(f"[{block.type}: {block.mime_type}, about {size} bytes, not shown]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {resource.uri}]")
        else:
            uri = getattr(block, "uri", "")
            parts.append(f"[{getattr(block, 'type', 'content')} {uri}]".strip())
    if result.structured_content is not None and not any(parts):
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[cut at {MAX_RESULT_CHARS} characters]"
    return text, tuple(images)
