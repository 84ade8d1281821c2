"""The gateway's test parts: the real ASGI app (``orchestrator.asgi``) served by uvicorn on
loopback, the loopback model server, employees wired to it, and callers with API tokens."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from django.contrib.auth.models import User

from gateway import runner
from gateway.services import grant_create
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, model_endpoint_create
from orchestrator.agents.wiring import employee_tool_registry
from orchestrator.dbpool import db_threads_close
from runtime.model_pool import close_http_pool
from runtime.tools import ToolContext, ToolResult
from runtime.types import Effect, ToolSpec
from tests.support.model_server import ModelServer, make_model_server, model_server

__all__ = ["make_model_server", "model_server"]

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


class WeatherTool:
    """A server-side read tool that answers from a table (``sleep``: how long it takes)."""

    def __init__(self, sleep: float = 0.0) -> None:
        self.spec = ToolSpec("weather", "The weather of a city.", CITY, Effect.READ)
        self.sleep = sleep
        self.calls: list[dict[str, Any]] = []
        self.cancelled = threading.Event()
        self.cancelled_at: float | None = None

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        self.calls.append(arguments)
        try:
            await asyncio.sleep(self.sleep)
        except asyncio.CancelledError:
            self.cancelled_at = time.monotonic()
            self.cancelled.set()
            raise
        return ToolResult(f"{arguments['city']}: sunny, 21 C")


@pytest.fixture
def weather(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> WeatherTool:
    """The gateway's tool registry (the production one) with the ``weather`` tool added."""
    tool = WeatherTool()
    tools = employee_tool_registry(tmp_path / "ledger")
    tools.register(tool)
    monkeypatch.setattr(runner, "_registry", lambda: tools)
    return tool


@pytest.fixture
def server(
    seeded_profiles: None, monkeypatch: pytest.MonkeyPatch, weather: WeatherTool
) -> Iterator[str]:
    """``http://127.0.0.1:<port>``: the production ASGI app under uvicorn, in a thread."""
    from django.db import connections

    from orchestrator.asgi import application

    # Django closes a request's connection at its end only with CONN_MAX_AGE 0.
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(application, log_level="warning", lifespan="on")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    # Records are written after the answer: let the last ones land before the connections close.
    deadline = time.monotonic() + 15
    while runner.records_pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    for loop in list(runner.POOLED_LOOPS):  # the pooled model clients of the server's loop
        if not loop.is_closed():
            asyncio.run_coroutine_threadsafe(close_http_pool(), loop).result(timeout=10)
        runner.POOLED_LOOPS.discard(loop)
    db_threads_close()
    instance.should_exit = True
    thread.join(timeout=30)
    sock.close()
    gc.unfreeze()  # the app's lifespan froze this (test) process's heap: give it back


@dataclass
class Team:
    """Employees on the loopback model server and callers of them."""

    model: ModelServer

    def employee(self, username: str, base_url: str = "", **fields: Any) -> Employee:
        """An employee on the model server (or on ``base_url``)."""
        endpoint = model_endpoint_create(
            name=f"{username}-loopback",
            provider="openai",
            base_url=base_url or self.model.url,
            model=f"{username}-model",
            max_retries=0,
            timeout_seconds=30,
        )
        fields.setdefault("system_prompt", f"You are {username}.")
        return employee_create(username=username, endpoint=endpoint, **fields)

    def caller(self, username: str, *employees: Employee, roles: tuple[Role, ...] = ()) -> str:
        """An API token of ``username``, granted ``employees``."""
        user: User = user_ensure(username=username, roles=roles)
        for employee in employees:
            grant_create(employee=employee, user=user, actor="test")
        return api_token_create(user=user, name="gateway-test")


@pytest.fixture
def team(model_server: ModelServer) -> Team:
    return Team(model_server)


@pytest.fixture
def make_team(make_model_server: Callable[[], ModelServer]) -> Callable[[], Team]:
    return lambda: Team(make_model_server())
