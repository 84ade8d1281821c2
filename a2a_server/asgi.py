"""The HTTP side of served patterns, mounted at ``/a2a`` by ``orchestrator.asgi``:

* ``GET /a2a/<key>/.well-known/agent-card.json``: the pattern's agent card (any role);
* ``POST /a2a/<key>``: A2A JSON-RPC (the SDK's dispatcher; A2A 1.0 methods with the
  ``A2A-Version: 1.0`` header, and the 0.3 names ``message/send``, ``tasks/get``, ...).

Before the SDK sees a request: a bearer API token (401 problem+json otherwise), a role (403),
the pattern served as an A2A agent (404), a body within ``LOOPWRIGHT_MAX_BODY_BYTES`` and
:mod:`orchestrator.jsonlimits` (a JSON-RPC error otherwise), and for the methods that start or
cancel runs the operator role (403).
"""

from __future__ import annotations

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from django.conf import settings
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from a2a_server.handler import CALLER_KEY, PATTERN_KEY, PatternRequestHandler, in_thread
from a2a_server.protocol import agent_card
from a2a_server.records import A2ACaller, ServedPattern
from a2a_server.services import a2a_caller_resolve, served_pattern
from orchestrator.errors import NotFound
from orchestrator.jsonlimits import JsonRefused, loads_bounded

#: Methods that start or cancel runs (A2A 1.0 and 0.3 names): the operator role.
OPERATING_METHODS = frozenset(
    {
        "SendMessage",
        "SendStreamingMessage",
        "CancelTask",
        "message/send",
        "message/stream",
        "tasks/cancel",
    }
)
_SCOPE_KEY = "loopwright_a2a"


def _problem(status: int, kind: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": f"/problems/{kind}", "title": title, "status": status, "detail": detail}
    headers = {"WWW-Authenticate": 'Bearer realm="loopwright"'} if status == 401 else None
    return JSONResponse(
        {**body, **extra}, status, headers=headers, media_type="application/problem+json"
    )


def _rpc_error(code: int, message: str, request_id: Any = None) -> JSONResponse:
    error = {"code": code, "message": message}
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error})


def _served(key: str) -> ServedPattern | None:
    try:
        return served_pattern(key)
    except NotFound:
        return None


async def _admitted(request: Request) -> tuple[A2ACaller, ServedPattern] | Response:
    """The caller and the pattern of the request, or the 401/403/404 problem answering it."""
    scheme, _, raw = request.headers.get("authorization", "").partition(" ")
    caller = None
    if scheme.lower() == "bearer" and raw.strip():
        caller = await in_thread(a2a_caller_resolve, raw.strip())
    if caller is None:
        detail = "A2A agents need a Loopwright API token: Authorization: Bearer <token>."
        return _problem(401, "not-authenticated", "Authentication required", detail)
    if not caller.can_read:
        return _problem(403, "forbidden", "Forbidden", "Your account has no Loopwright role.")
    key = str(request.path_params["key"])
    pattern = await in_thread(_served, key)
    if pattern is None:
        return _problem(404, "not-found", "Not found", f"No pattern {key!r} is served over A2A.")
    return caller, pattern


def _agent_url(request: Request, key: str) -> str:
    """Where this pattern's JSON-RPC endpoint is, as the caller reached this server."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return f"{request.url.scheme}://{request.url.netloc}{root}/{key}"


async def _card(request: Request) -> Response:
    admitted = await _admitted(request)
    if isinstance(admitted, Response):
        return admitted
    _caller, pattern = admitted
    card = agent_card(pattern, _agent_url(request, pattern.key))
    return JSONResponse(agent_card_to_dict(card))


async def _body(request: Request) -> bytes | None:
    """The whole body, or None past ``LOOPWRIGHT_MAX_BODY_BYTES``."""
    limit = int(settings.LOOPWRIGHT_MAX_BODY_BYTES)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _replayed(request: Request, body: bytes, extra: dict[str, Any]) -> Request:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return dict(await request.receive())
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({**request.scope, _SCOPE_KEY: extra}, receive)


class CallerContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context, with the caller and the pattern the ASGI layer admitted."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        admitted = request.scope.get(_SCOPE_KEY) or {}
        context.state[CALLER_KEY] = admitted.get(CALLER_KEY)
        context.state[PATTERN_KEY] = admitted.get(PATTERN_KEY)
        return context


def _method_of(payload: Any) -> tuple[Any, str]:
    if not isinstance(payload, dict):
        return None, ""
    request_id = payload.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, (str, int, type(None))):
        request_id = None
    method = payload.get("method")
    return request_id, method if isinstance(method, str) else ""


def rpc_endpoint(dispatcher: JsonRpcDispatcher) -> Any:
    """The JSON-RPC endpoint: admission (module docstring), then the SDK's dispatcher."""

    async def rpc(request: Request) -> Response:
        admitted = await _admitted(request)
        if isinstance(admitted, Response):
            return admitted
        caller, pattern = admitted
        body = await _body(request)
        if body is None:
            limit = int(settings.LOOPWRIGHT_MAX_BODY_BYTES)
            return _rpc_error(-32600, f"The request body is larger than {limit} bytes.")
        try:
            payload = loads_bounded(body.decode("utf-8"))
        except JsonRefused as exc:
            return _rpc_error(-32600, f"Invalid request: {exc.detail} at {exc.pointer or '/'}")
        except ValueError as exc:  # not JSON, or not UTF-8
            return _rpc_error(-32700, f"Parse error: {exc}")
        request_id, method = _method_of(payload)
        if method in OPERATING_METHODS and not caller.can_operate:
            detail = f"{method} starts or cancels runs: it needs the operator role."
            return _problem(403, "forbidden", "Forbidden", detail, rpc_id=request_id)
        extra = {CALLER_KEY: caller, PATTERN_KEY: pattern.key}
        return await dispatcher.handle_requests(_replayed(request, body, extra))

    return rpc


async def _http_problem(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 405:
        allowed = "GET for the agent card, POST for JSON-RPC"
        return _problem(405, "method-not-allowed", "Method not allowed", f"Use {allowed}.")
    detail = "Nothing is served here: see /a2a/<pattern key>/.well-known/agent-card.json."
    return _problem(404, "not-found", "Not found", detail)


def a2a_asgi() -> Starlette:
    """The ASGI app serving every A2A-enabled pattern under its key."""
    dispatcher = JsonRpcDispatcher(
        request_handler=PatternRequestHandler(),
        context_builder=CallerContextBuilder(),
        enable_v0_3_compat=True,
    )
    return Starlette(
        routes=[
            Route("/{key}", rpc_endpoint(dispatcher), methods=["POST"]),
            Route(f"/{{key}}{AGENT_CARD_WELL_KNOWN_PATH}", _card, methods=["GET"]),
        ],
        exception_handlers={404: _http_problem, 405: _http_problem},
    )
