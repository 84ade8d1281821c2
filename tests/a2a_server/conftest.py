"""The A2A tests' parts: the production ASGI app (``orchestrator.asgi``) served by uvicorn on
loopback, callers with API tokens, A2A-enabled patterns, the official ``a2a-sdk`` client, and a
git repository for runs whose makers' diff becomes the verifier's evidence."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import AgentCard, Message, Part, Role, SendMessageRequest
from google.protobuf import json_format, struct_pb2

from orchestrator.accounts.roles import Role as LoopwrightRole
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support.asgi_server import uvicorn_thread

T = TypeVar("T")


@pytest.fixture
def server(seeded_profiles: None, monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[str]:
    """``http://127.0.0.1:<port>``: the production ASGI app under uvicorn, in a thread; tasks
    are polled every 0.1 s."""
    from django.db import connections

    from orchestrator.asgi import application

    settings.LOOPWRIGHT_A2A = {"POLL_SECONDS": 0.1, "WAIT_SECONDS": 60.0}
    # Django closes a request's connection at its end only with CONN_MAX_AGE 0.
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)
    with uvicorn_thread(application) as url:
        yield url
    gc.unfreeze()  # the app's lifespan froze this (test) process's heap: give it back


@pytest.fixture
def token_of(transactional_db: None) -> Callable[..., str]:
    """``token_of("ops", LoopwrightRole.OPERATOR)``: an API token of that user and roles."""

    def make(username: str, *roles: LoopwrightRole) -> str:
        return api_token_create(user=user_ensure(username=username, roles=roles), name="a2a")

    return make


@pytest.fixture
def operator_token(token_of: Callable[..., str]) -> str:
    return token_of("a2a-operator", LoopwrightRole.OPERATOR)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A git repository with one commit on ``main``."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("hello\n")
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "README"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def run_async(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on a fresh event loop (the a2a client is async; the tests are not)."""
    return asyncio.run(work)


def authorised(token: str, timeout: float = 60) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout)


async def card_of(base: str, key: str, token: str) -> AgentCard:
    """The agent card as the SDK's resolver reads it from the well-known path."""
    async with authorised(token) as http:
        return await A2ACardResolver(http, f"{base}/a2a/{key}").get_agent_card()


async def client_for(
    base: str, key: str, http: httpx.AsyncClient, *, streaming: bool = True, polling: bool = False
) -> Client:
    """The SDK's client made from the pattern's card (the transport the card names)."""
    card = await A2ACardResolver(http, f"{base}/a2a/{key}").get_agent_card()
    config = ClientConfig(httpx_client=http, streaming=streaming, polling=polling)
    return ClientFactory(config).create(card)


def data_message(values: dict[str, Any], message_id: str = "m-1") -> SendMessageRequest:
    data = json_format.ParseDict(values, struct_pb2.Value())
    message = Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(data=data)])
    return SendMessageRequest(message=message)


def text_message(text: str, message_id: str = "m-1") -> SendMessageRequest:
    message = Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])
    return SendMessageRequest(message=message)


Consumer = Callable[[list[Any]], Coroutine[Any, Any, None]]


class Collector:
    """Runs ``consume(items)`` on its own thread and event loop; it appends what it receives."""

    def __init__(self, consume: Consumer) -> None:
        self.items: list[Any] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(consume,), daemon=True)
        self._thread.start()

    def _run(self, consume: Consumer) -> None:
        try:
            asyncio.run(consume(self.items))
        except BaseException as exc:  # handed to the test by join()
            self.error = exc

    def wait_for_items(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.items) < count:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"fewer than {count} items: {self.items}"
            time.sleep(0.02)

    def join(self, timeout: float = 60) -> list[Any]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"
        if self.error is not None:
            raise self.error
        return self.items
