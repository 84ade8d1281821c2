"""Live text: what a streaming model step has said so far is readable on the run page's live feed
while the stream arrives (``loops.live_text``), throttled, and gone once the call returns.

The writer is the production client (``OpenAICompatibleClient``) wrapped by ``LiveTextClient``
as the worker wraps it, streaming from the loopback model server; the reader is the run page's
server-sent-events endpoint. The store is the suite's: Redis when ``REDIS_URL`` is set, files
under the var directory otherwise.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client, RequestFactory

from frontend.streams import RunFeed
from loops import live_text
from loops.live_text import LiveText, LiveTextClient
from loops.models import RunStatus
from runtime.invocation import LoopRole
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig
from runtime.scripted import ScriptedModelClient, load_script
from runtime.types import ChatRequest, ChatResponse
from tests.support.factories import make_run
from tests.support.fake_model import make_request
from tests.support.model_server import (
    Completion,
    ModelServer,
    Pause,
    Stream,
    Text,
    make_model_server,
    model_server,
)
from tests.support.workers import wait_for
from tests.ui.conftest import make_user

__all__ = ["make_model_server", "model_server"]

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]
SO_FAR = "Drafting the summary: every check passed"


@pytest.fixture(autouse=True)
def _short_streams(settings: Any) -> None:
    settings.LOOPWRIGHT_UI = {
        "SSE_POLL_SECONDS": 0.05,
        "SSE_HEARTBEAT_SECONDS": 0.2,
        "SSE_MAX_SECONDS": 0.3,
        "SSE_RETRY_MS": 1500,
    }


def live_messages(client: Client, run_id: uuid.UUID) -> list[dict[str, Any]]:
    """The ``live`` messages of one connection to the run page's stream."""
    response = client.get(f"/ui/stream/runs/{run_id}?after=1")
    body = b"".join(response.streaming_content).decode()
    out = []
    for block in body.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if lines.get("event") == "live":
            out.append(json.loads(lines["data"]))
    return out


class Call(threading.Thread):
    """One streamed model call of ``run_id``'s ``maker:0``, as the worker makes it."""

    def __init__(self, server: ModelServer, run_id: uuid.UUID) -> None:
        super().__init__(daemon=True)
        config = EndpointConfig(name="live", base_url=server.url, model="m", timeout_seconds=20)
        request = make_request(run_id=run_id, role=LoopRole.MAKER, invocation="maker:0")
        self.client = LiveTextClient(OpenAICompatibleClient(config), request)
        self.response: ChatResponse | None = None

    def run(self) -> None:
        chat = ChatRequest(messages=[{"role": "user", "content": "Summarise."}], stream=True)
        self.response = asyncio.run(self.client.complete(chat))


def test_the_run_page_shows_the_text_of_a_slow_stream_while_it_arrives(
    model_server: ModelServer, client_as: ClientAs
) -> None:
    run = make_run(status=RunStatus.RUNNING)
    model_server.queue(
        Stream([Text("Drafting the summary: "), Text("every check passed"), Pause(3), Text(".")])
    )
    call = Call(model_server, run.id)
    call.start()
    wait_for(
        lambda: [e.text for e in live_text.read(run.id)] == [SO_FAR], timeout=10, interval=0.05
    )
    [live] = live_messages(client_as("viewer"), run.id)
    assert call.is_alive()  # the stream is still paused mid-answer
    assert (live["invocation"], live["group"], live["text"]) == ("maker:0", "inv-maker-0", SO_FAR)
    assert SO_FAR in live["html"] and 'id="live-inv-maker-0"' in live["html"]
    assert "Maker 1" in live["group_html"]  # the group, for a page that has no step of it yet
    call.join(timeout=20)
    assert call.response is not None and call.response.content == SO_FAR + "."
    # The call returned (its step is persisted next): the live text is gone.
    assert live_text.read(run.id) == []
    assert live_messages(client_as("viewer"), run.id) == []


def test_a_feed_sends_live_text_when_it_changes_and_its_end_once() -> None:
    run = make_run(status=RunStatus.RUNNING)
    store = live_text.store()
    store.put(run.id, LiveText("leader", "leader", "Planning", 8, time.time()))
    request = RequestFactory().get(f"/ui/stream/runs/{run.id}")
    request.user = make_user("viewer")
    feed = RunFeed(request, run.id, after_event=1, after_step=0, open_steps=set())

    def live() -> list[Any]:
        return [m for m in feed.poll() if m.event == "live"]

    assert [m.data["text"] for m in live()] == ["Planning"]
    assert live() == []  # unchanged: nothing sent
    store.put(run.id, LiveText("leader", "leader", "Planning the work", 17, time.time()))
    assert [m.data["text"] for m in live()] == ["Planning the work"]
    store.clear(run.id, "leader")
    [gone] = live()
    assert (gone.data["group"], gone.data["html"]) == ("inv-leader", "")
    assert live() == []


def test_an_entry_left_by_a_dead_worker_is_ignored_after_its_ttl() -> None:
    run_id = uuid.uuid4()
    store = live_text.store()
    old = time.time() - live_text.TTL_SECONDS - 1
    store.put(run_id, LiveText("maker:0", "maker", "stale", 5, old))
    assert live_text.read(run_id) == []
    assert store.entries(run_id) == []  # and removed


class RecordingStore:
    """A store that keeps what was written, to count the writes of one call."""

    def __init__(self) -> None:
        self.puts: list[LiveText] = []
        self.cleared: list[str] = []

    def put(self, run_id: uuid.UUID, entry: LiveText) -> None:
        self.puts.append(entry)

    def clear(self, run_id: uuid.UUID, invocation: str) -> None:
        self.cleared.append(invocation)

    def entries(self, run_id: uuid.UUID) -> list[LiveText]:
        return self.puts[-1:] if not self.cleared else []


def test_writes_are_throttled_and_the_text_is_bounded(model_server: ModelServer) -> None:
    # A long first chunk, then 200 small ones over about a second: a write at most every 250 ms,
    # each the latest text so far, never more than MAX_CHARS of it.
    events: list[Any] = [Text("x" * (live_text.MAX_CHARS + 500))]
    for i in range(200):
        events.append(Text(f" word{i:03d}"))
        if i % 20 == 19:
            events.append(Pause(0.1))
    model_server.queue(Stream(events))
    store = RecordingStore()
    config = EndpointConfig(name="live", base_url=model_server.url, model="m", timeout_seconds=20)
    client = LiveTextClient(
        OpenAICompatibleClient(config), make_request(invocation="maker:0"), store=store
    )
    chat = ChatRequest(messages=[{"role": "user", "content": "Go."}], stream=True)
    started = time.monotonic()
    content = asyncio.run(client.complete(chat)).content
    elapsed = time.monotonic() - started
    assert 2 <= len(store.puts) <= elapsed / live_text.WRITE_INTERVAL_SECONDS + 2
    for entry in store.puts:
        assert entry.truncated and len(entry.text) == live_text.MAX_CHARS
        assert entry.text == content[: entry.chars][-live_text.MAX_CHARS :]
    assert [e.chars for e in store.puts] == sorted({e.chars for e in store.puts})
    assert store.cleared == ["maker:0"]


def test_a_call_that_does_not_stream_writes_nothing(model_server: ModelServer) -> None:
    model_server.queue(Completion(content="plain"))
    store = RecordingStore()
    config = EndpointConfig(name="live", base_url=model_server.url, model="m")
    client = LiveTextClient(OpenAICompatibleClient(config), make_request(), store=store)
    chat = ChatRequest(messages=[{"role": "user", "content": "Go."}])
    assert asyncio.run(client.complete(chat)).content == "plain"
    assert (store.puts, store.cleared) == ([], [])


def test_the_offline_scripted_model_streams_through_the_same_wrapper() -> None:
    # A demo employee set to stream: its answer arrives whole, so nothing needs writing.
    store = RecordingStore()
    scripted = ScriptedModelClient(load_script("demo"))
    client = LiveTextClient(scripted, make_request(), store=store)
    chat = ChatRequest(messages=[{"role": "system", "content": "role:verifier"}], stream=True)
    assert '"verdict": "pass"' in asyncio.run(client.complete(chat)).content
    assert (store.puts, store.cleared) == ([], [])
