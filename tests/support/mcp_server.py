"""A real MCP server (the official SDK's ``MCPServer``) on loopback, served by uvicorn in a
thread, with tools of each effect tier; it records every call it receives.

Tools: ``search`` (readOnlyHint), ``add_note`` (no hints: write), ``delete_page``
(destructiveHint), ``tag_page`` (idempotentHint), ``slow_write`` (sleeps, then records),
``fail`` (answers with isError) and ``chart`` (readOnlyHint; a text block and a PNG image block). With ``key`` set, every request needs ``X-Docs-Key: <key>``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.context import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ImageContent, TextContent, ToolAnnotations
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

PAGES = {"intro": "Loopwright runs agent loops.", "install": "Run make demo."}
#: The image ``chart`` answers with: a 1x1 PNG, base64.
CHART_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
    "rkJggg=="
)


@dataclass
class DocsServer:
    """The server's state: what it was called with, and its switches."""

    key: str = ""
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    started_slow: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _sock: socket.socket | None = None

    def names(self) -> list[str]:
        return [name for name, _args, _meta in self.calls]

    def app(self) -> ASGIApp:
        mcp = MCPServer("docs")
        calls = self.calls
        started = self.started_slow

        def meta_of(ctx: Context) -> dict[str, Any]:
            return dict(ctx.request_context.meta or {})

        @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
        def search(query: str) -> str:
            """Search the docs pages."""
            calls.append(("search", {"query": query}, {}))
            hits = [f"{k}: {v}" for k, v in PAGES.items() if query.lower() in v.lower()]
            return "\n".join(hits) or "no page matches"

        @mcp.tool()
        def add_note(text: str, ctx: Context) -> str:
            """Add a note to the docs."""
            calls.append(("add_note", {"text": text}, meta_of(ctx)))
            return f"note added: {text}"

        @mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
        def delete_page(page: str) -> str:
            """Delete a docs page."""
            calls.append(("delete_page", {"page": page}, {}))
            return f"deleted {page}"

        @mcp.tool(annotations=ToolAnnotations(idempotent_hint=True))
        def tag_page(page: str, tag: str) -> str:
            """Tag a page (tagging twice changes nothing)."""
            calls.append(("tag_page", {"page": page, "tag": tag}, {}))
            return f"{page} tagged {tag}"

        @mcp.tool()
        async def slow_write(seconds: float) -> str:
            """Write slowly."""
            started.set()
            await asyncio.sleep(seconds)
            calls.append(("slow_write", {"seconds": seconds}, {}))
            return "written"

        @mcp.tool()
        def fail(reason: str) -> str:
            """Always fails."""
            calls.append(("fail", {"reason": reason}, {}))
            raise ToolError(reason)

        @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
        def chart(page: str) -> list[TextContent | ImageContent]:
            """A chart of a page's visits, as an image."""
            calls.append(("chart", {"page": page}, {}))
            return [
                TextContent(type="text", text=f"Visits of {page}:"),
                ImageContent(type="image", data=CHART_PNG, mime_type="image/png"),
            ]

        inner = mcp.streamable_http_app()
        key = self.key

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and key:
                headers = dict(scope.get("headers") or [])
                if headers.get(b"x-docs-key", b"").decode() != key:
                    await JSONResponse({"error": "bad key"}, status_code=401)(scope, receive, send)
                    return
            await inner(scope, receive, send)

        return guarded

    def start(self) -> DocsServer:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        port = self._sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port}/mcp"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._sock is not None:
            self._sock.close()
