"""A client that disconnects mid-stream cancels the chat within 1 s: the model call (a slow
streaming model server sees its connection dropped) and a running server-side tool (cancelled).
The request is recorded as ended by the disconnect."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest

from gateway.models import ChatCompletionRecord
from tests.gateway.conftest import Team, WeatherTool
from tests.support.model_server import Completion, streamed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


class _SlowHandler(BaseHTTPRequestHandler):
    server: SlowModel

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.server.streaming.set()
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                chunk = {
                    "id": "slow",
                    "object": "chat.completion.chunk",
                    "model": "slow",
                    "choices": [{"index": 0, "delta": {"content": "tick "}, "finish_reason": None}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.02)
        except OSError:
            self.server.dropped_at = time.monotonic()


class SlowModel(ThreadingHTTPServer):
    """A model that streams "tick " every 20 ms for a minute and notes when its client hangs
    up (a write fails within two ticks of it)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SlowHandler)
        self.streaming = threading.Event()
        self.dropped_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


@pytest.fixture
def slow_model() -> Iterator[SlowModel]:
    server = SlowModel()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _open_stream(server: str, key: str, model: str, until: str) -> float:
    """Stream a chat until a chunk holding ``until`` arrives, then hang up; when it hung up."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx2.Client(timeout=30) as client,
        client.stream("POST", f"{server}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if until in line:
                break
        else:
            pytest.fail(f"the stream ended before {until!r}")
    return time.monotonic()


def _record(timeout: float = 5.0) -> ChatCompletionRecord:
    deadline = time.monotonic() + timeout
    while (found := ChatCompletionRecord.objects.first()) is None:
        assert time.monotonic() < deadline, "no record written"
        time.sleep(0.02)
    return found


def test_a_disconnect_cancels_the_model_call_within_a_second(
    server: str, team: Team, slow_model: SlowModel
) -> None:
    key = team.caller("alice", team.employee("slow", base_url=slow_model.url, streaming=True))
    hung_up = _open_stream(server, key, "slow", "tick")
    deadline = hung_up + 5
    while slow_model.dropped_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow_model.dropped_at is not None, "the model call still runs"
    assert slow_model.dropped_at - hung_up < 1.0
    record = _record()
    assert (record.status, record.stream) == ("error", True)
    assert record.error == "the client disconnected"


def test_a_disconnect_cancels_a_running_tool_within_a_second(
    server: str, team: Team, weather: WeatherTool
) -> None:
    weather.sleep = 60
    key = team.caller("alice", team.employee("ada", tools=["weather"], streaming=True))
    call = Completion(tool_calls=[("weather", json.dumps({"city": "Oslo"}))])
    team.model.queue(streamed(call))
    hung_up = _open_stream(server, key, "ada", "tool_started")
    assert weather.cancelled.wait(5), "the tool still runs"
    assert weather.cancelled_at is not None and weather.cancelled_at - hung_up < 1.0
    record = _record()
    assert record.status == "error" and record.tool_calls == 1
    assert record.duration_ms < 5_000


def test_a_disconnect_cancels_a_non_streamed_chat_too(
    server: str, team: Team, weather: WeatherTool
) -> None:
    weather.sleep = 60
    key = team.caller("alice", team.employee("ada", tools=["weather"]))
    team.model.queue(Completion(tool_calls=[("weather", json.dumps({"city": "Oslo"}))]))
    body = json.dumps({"model": "ada", "messages": [{"role": "user", "content": "go"}]}).encode()
    host, port = server.removeprefix("http://").split(":")
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request + body)
        deadline = time.monotonic() + 20
        while not weather.calls:
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.01)
    hung_up = time.monotonic()
    assert weather.cancelled.wait(5), "the tool still runs"
    assert weather.cancelled_at is not None and weather.cancelled_at - hung_up < 1.0
