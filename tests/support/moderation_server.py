"""A real OpenAI-compatible moderation server on 127.0.0.1 (``POST /v1/moderations``).

By default it flags an input containing any of ``server.triggers`` (category ``violence``);
tests queue other replies: :class:`Flag` (flag these categories), ``Error`` / ``Delay`` /
``Hangup`` from :mod:`tests.support.model_server`, or a raw body. Every request is recorded.

Usage::

    def test_something(moderation_server):
        moderation_server.queue(Error(500, {"error": {"message": "down"}}))
        ... rule url = moderation_server.url ...
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.model_server import Delay, Error, Hangup, RecordedRequest

MODERATION_PATH = "/v1/moderations"


@dataclass(frozen=True)
class Flag:
    """Answer flagged (``categories`` non-empty) or not flagged (empty)."""

    categories: Sequence[str] = ()


ModerationReply = Flag | Error | Delay | Hangup | str


def moderation_body(
    categories: Sequence[str], model: str = "omni-moderation-test"
) -> dict[str, Any]:
    known = ("harassment", "hate", "self-harm", "sexual", "violence", *categories)
    return {
        "id": "modr-test",
        "model": model,
        "results": [
            {
                "flagged": bool(categories),
                "categories": {name: name in categories for name in known},
                "category_scores": {name: 0.99 if name in categories else 0.01 for name in known},
            }
        ],
    }


class _ModerationHandler(BaseHTTPRequestHandler):
    server: _ModerationHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = raw.decode(errors="replace")
        headers = {key.lower(): value for key, value in self.headers.items()}
        request = RecordedRequest(self.path, headers, body, time.monotonic())
        reply = self.server.owner.take(request)
        with contextlib.suppress(OSError):  # the client gave up (timeout) and hung up
            self._send(reply)

    def _send(self, reply: ModerationReply) -> None:
        if isinstance(reply, Delay):
            if not self.server.owner.stopping.wait(reply.seconds):
                self._send(reply.then)  # type: ignore[arg-type]
        elif isinstance(reply, Hangup):
            self.close_connection = True
        elif isinstance(reply, Error):
            self._write(reply.status, reply.body)
        elif isinstance(reply, Flag):
            self._write(200, moderation_body(reply.categories))
        else:
            self._write(200, reply)

    def _write(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _ModerationHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    owner: ModerationServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.owner.errors.append(traceback.format_exc())


class ModerationServer:
    """The loopback moderation server (see the module docstring)."""

    def __init__(self) -> None:
        self.triggers: tuple[str, ...] = ("attack",)
        self.requests: list[RecordedRequest] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self._replies: deque[ModerationReply] = deque()
        self._lock = threading.Lock()
        self._server = _ModerationHTTPServer(("127.0.0.1", 0), _ModerationHandler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        """The full moderations URL a rule is configured with."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{MODERATION_PATH}"

    def queue(self, *replies: ModerationReply) -> ModerationServer:
        with self._lock:
            self._replies.extend(replies)
        return self

    def take(self, request: RecordedRequest) -> ModerationReply:
        with self._lock:
            self.requests.append(request)
            if request.path != MODERATION_PATH:
                return Error(404, {"error": {"message": f"no route {request.path}"}})
            if self._replies:
                return self._replies.popleft()
        text = request.body.get("input", "") if isinstance(request.body, dict) else ""
        hit = any(word in str(text).lower() for word in self.triggers)
        return Flag(("violence",) if hit else ())

    def start(self) -> ModerationServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def moderation_server() -> Iterator[ModerationServer]:
    server = ModerationServer().start()
    yield server
    server.stop()
    assert not server.errors, "moderation server errors:\n" + "\n".join(server.errors)
