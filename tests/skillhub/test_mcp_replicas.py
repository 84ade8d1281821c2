"""Several web replicas behind one address: with ``LOOPWRIGHT_MCP_STATELESS`` any replica answers
any MCP request, without sticky sessions; without it a session lives in the replica that
opened it. Two replicas are two MCP endpoints (each its own SDK session manager, as two
processes have), served by uvicorn on loopback and called over raw streamable HTTP."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from skillhub.mcp import mcp_asgi
from skillhub.models import Skill
from tests.support.asgi_server import uvicorn_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
ACCEPT = "application/json, text/event-stream"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "replica-test", "version": "1"},
    },
}


def _replica_app() -> Any:
    """One replica's ASGI app: the MCP endpoint with its own session manager, run by lifespan."""
    app, endpoint = mcp_asgi()

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            async with endpoint.running():
                await send({"type": "lifespan.startup.complete"})
                await receive()  # shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        await app(scope, receive, send)

    return asgi


@pytest.fixture
def replicas(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[str]]]:
    from django.db import connections

    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)
    with contextlib.ExitStack() as servers:

        def start() -> list[str]:
            return [servers.enter_context(uvicorn_thread(_replica_app())) + "/mcp" for _ in "ab"]

        yield start


def _answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a streamable HTTP response (JSON, or one SSE ``data:`` line)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return dict(response.json())
    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return dict(json.loads(data[-1]))


def _headers(bearer: str, session: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {bearer}", "Accept": ACCEPT}
    if session:
        headers["Mcp-Session-Id"] = session
    return headers


def _list_after_initialize(urls: list[str], bearer: str) -> httpx2.Response:
    """Initialize on the first replica, then list tools on the second (a load balancer's
    round robin)."""
    opened = httpx2.post(urls[0], json=INITIALIZE, headers=_headers(bearer))
    assert opened.status_code == 200, opened.text
    session = opened.headers.get("mcp-session-id")
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    return httpx2.post(urls[1], json=listing, headers=_headers(bearer, session), timeout=30)


@pytest.fixture
def bearer(make_skill: Callable[..., Skill]) -> str:
    make_skill()
    user = user_ensure(username="mcp-replicas", roles=[Role.OPERATOR])
    return api_token_create(user=user, name="mcp")


def test_stateless_replicas_answer_each_others_clients(
    settings: Any, replicas: Callable[[], list[str]], bearer: str
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "MCP_STATELESS": True}
    listed = _list_after_initialize(replicas(), bearer)
    assert listed.status_code == 200, listed.text
    assert [tool["name"] for tool in _answer(listed)["result"]["tools"]] == ["py_add"]


def test_without_it_a_session_belongs_to_the_replica_that_opened_it(
    settings: Any, replicas: Callable[[], list[str]], bearer: str
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "MCP_STATELESS": False}
    listed = _list_after_initialize(replicas(), bearer)
    assert listed.status_code == 404  # the other replica never saw that session
