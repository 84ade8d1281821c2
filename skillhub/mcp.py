"""The Skill Hub's MCP server: the official ``mcp`` SDK's low-level ``Server`` over streamable
HTTP, mounted at ``/mcp`` by ``orchestrator.asgi`` (docs/skills.md).

* ``tools/list``: the enabled skills visible to the caller, ``{name, description, inputSchema,
  outputSchema, annotations}`` (``readOnlyHint`` for a read-effect skill, else ``destructiveHint``).
* ``tools/call``: runs one through the execution service (validation, role check, rate limit,
  ``skills`` queue, sandbox) and returns its output as text content plus a manifest of output
  files (also as ``structuredContent``); ``isError`` when the program failed or was refused.

Authentication is the service's own bearer API tokens: :class:`BearerAuth` answers 401 before
the SDK sees a request without a valid token, and puts the user's id in the ASGI scope; each
handler resolves the caller from the HTTP request it serves, so every request is authorised by
its own token. Tool lists come from the database, so the low-level server (dynamic tools) is
used rather than decorated functions.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from orchestrator.accounts.services import TokenRefused, api_token_authenticate
from orchestrator.errors import NO_CREDENTIALS, DomainError
from orchestrator.jsonlimits import JsonRefused, loads_bounded
from skillhub.services.access import Caller
from skillhub.services.calls import mcp_call_tool, mcp_list_tools

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
_USER_KEY = "loopwright_user_id"


def _user_of(ctx: Any) -> Any:
    request = getattr(ctx, "request", None)
    user_id = None if request is None else request.scope.get(_USER_KEY)
    if user_id is None:
        raise PermissionError("unauthenticated MCP request")
    return get_user_model().objects.get(pk=user_id)


def _list_tools_sync(ctx: Any) -> list[dict[str, Any]]:
    return mcp_list_tools(Caller.for_user(_user_of(ctx)))


def _call_tool_sync(ctx: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    caller = Caller.for_user(_user_of(ctx))
    try:
        return mcp_call_tool(name=name, arguments=arguments, caller=caller, origin="mcp")
    except DomainError as exc:
        problem = {"status": exc.status_code, "title": exc.title, "detail": exc.detail, **exc.extra}
        return {
            "content": [{"type": "text", "text": f"{exc.title}: {exc.detail}"}],
            "isError": True,
            "structuredContent": {"problem": problem},
        }


def _closing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for a pool thread: its database connection is closed when it returns (an
    executor thread's connection is otherwise only dropped by the garbage collector)."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        finally:
            connection.close()

    return call


async def _on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    tools = await sync_to_async(_closing(_list_tools_sync), thread_sensitive=False)(ctx)
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=t["name"],
                description=t["description"],
                input_schema=t["inputSchema"],
                output_schema=t["outputSchema"],
                annotations=types.ToolAnnotations.model_validate(t["annotations"]),
            )
            for t in tools
        ]
    )


async def _on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    result = await sync_to_async(_closing(_call_tool_sync), thread_sensitive=False)(
        ctx, params.name, dict(params.arguments or {})
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=c["text"]) for c in result["content"]],
        is_error=result["isError"],
        structured_content=json.loads(json.dumps(result["structuredContent"], default=str)),
    )


def mcp_server() -> Server[Any]:
    return Server(
        "loopwright-skill-hub",
        version="1",
        instructions="Loopwright Skill Hub: sandboxed Python and Node.js skills as tools.",
        on_list_tools=_on_list_tools,
        on_call_tool=_on_call_tool,
    )


def _security() -> TransportSecuritySettings:
    extra = list(settings.SKILLHUB["MCP_ALLOWED_HOSTS"])
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", *extra]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    origins += [f"https://{h}" for h in extra] + [f"http://{h}" for h in extra]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def _resolve_token(header: str) -> int | str:
    """The user id of a valid ``Authorization`` header's token, else the 401's detail."""
    try:
        return int(api_token_authenticate(header).user.pk)
    except TokenRefused as exc:
        return str(exc)
    finally:
        connection.close()


class BearerAuth:
    """ASGI middleware: a valid ``Authorization: Bearer <API token>`` or a 401 saying what is
    wrong (no token, another scheme, a malformed one, or unknown, revoked or expired)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        header = headers.get("authorization", "")
        found: int | str = NO_CREDENTIALS
        if header.strip():
            found = await sync_to_async(_resolve_token, thread_sensitive=False)(header)
        if isinstance(found, str):
            await _unauthorized(send, found)
            return
        await self.app({**scope, _USER_KEY: found}, receive, send)


async def _unauthorized(send: Any, detail: str) -> None:
    kind = "not-authenticated" if detail == NO_CREDENTIALS else "authentication-failed"
    title = "Authentication required" if detail == NO_CREDENTIALS else "Authentication failed"
    await _send_problem(
        send,
        {"type": f"/problems/{kind}", "title": title},
        401,
        detail,
        [(b"www-authenticate", b'Bearer realm="loopwright"')],
    )


async def _send_problem(
    send: Any,
    kind: dict[str, Any],
    status: int,
    detail: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps({**kind, "status": status, "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                *(headers or []),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BoundedBody:
    """ASGI middleware: the request body read whole, at most ``LOOPWRIGHT_MAX_BODY_BYTES``
    (413 beyond), and a JSON body held to :mod:`orchestrator.jsonlimits` (400 naming the
    place: depth, NUL characters, surrogates) before the SDK parses it; then replayed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        limit = int(settings.LOOPWRIGHT_MAX_BODY_BYTES)
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                kind = {"type": "/problems/payload-too-large", "title": "Request body too large"}
                detail = f"The request body is larger than {limit} bytes, the limit."
                await _send_problem(send, {**kind, "limit_bytes": limit}, 413, detail)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body"))
        body = b"".join(chunks)
        refused = _refused(body)
        if refused is not None:
            kind = {"type": "/problems/validation-error", "title": "Invalid input"}
            where = refused.pointer or "/"
            item = {"pointer": where, "detail": refused.detail, "code": refused.code}
            await _send_problem(send, {**kind, "errors": [item]}, 400, refused.detail)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _refused(body: bytes) -> JsonRefused | None:
    """The bounds' refusal of a JSON body; None when within them or not JSON at all (the SDK
    answers its own parse error)."""
    try:
        loads_bounded(body.decode("utf-8"))
    except JsonRefused as exc:
        return exc
    except ValueError:
        return None
    return None


class McpEndpoint:
    """The MCP endpoint's ASGI app. The SDK's session manager runs once per instance, so a new
    one is made each time the hosting app starts (``running()``, entered by its lifespan).
    Sessions live in that manager (one process) unless ``LOOPWRIGHT_MCP_STATELESS`` is set."""

    def __init__(self) -> None:
        self._app: ASGIApp | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        manager = StreamableHTTPSessionManager(
            app=mcp_server(),
            security_settings=_security(),
            stateless=settings.SKILLHUB["MCP_STATELESS"],
        )
        async with manager.run():
            self._app = StreamableHTTPASGIApp(manager)
            try:
                yield
            finally:
                self._app = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self._app is None:
            raise RuntimeError("the MCP session manager is not running (ASGI lifespan is off)")
        await self._app(scope, receive, send)


def mcp_asgi() -> tuple[ASGIApp, McpEndpoint]:
    """The authenticated ASGI app of the MCP endpoint, and the endpoint whose ``running()``
    the hosting app's lifespan must enter."""
    endpoint = McpEndpoint()
    return BearerAuth(BoundedBody(endpoint)), endpoint
