"""A real OpenAI-compatible HTTP server on 127.0.0.1 that replays a per-test script.

Tests queue replies; every ``POST /v1/chat/completions`` takes the next one (or the ``always``
reply once the queue is empty) and the server records each request. Replies:

- :class:`Completion`: a JSON completion (text and/or tool calls, reasoning, usage);
- :class:`Stream`: an SSE stream of chunks (:class:`Text`, :class:`Reasoning`,
  :class:`ToolCallStart` / :class:`ToolCallArgs` for arguments split across chunks,
  :class:`Pause`), a final usage chunk and ``data: [DONE]``;
- :class:`Error`: a status with a body and headers (429 + Retry-After, 500, 400 overflow, ...);
- :class:`Delay`: wait, then answer (client timeouts);
- :class:`Hangup`: close the connection without answering;
- a callable ``(RecordedRequest) -> reply`` (``request.body`` is the request JSON).

Usage::

    def test_something(model_server):
        model_server.queue(Completion(content="hi"))
        ... call model_server.url (".../v1") ...
        assert model_server.bodies[0]["model"] == "m"

A request arriving with nothing scripted gets a 500 and fails the test at teardown.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float


@dataclass(frozen=True)
class Completion:
    content: str | None = None
    #: (name, arguments) pairs or complete wire dicts.
    tool_calls: Sequence[tuple[str, str] | dict[str, Any]] = ()
    reasoning: str | None = None
    usage: tuple[int, int] = (10, 5)
    finish_reason: str | None = None
    model: str = "test-model"

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        calls = [_wire_call(i, call) for i, call in enumerate(self.tool_calls)]
        if calls:
            message["tool_calls"] = calls
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        finish = self.finish_reason or ("tool_calls" if calls else "stop")
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": _usage(self.usage),
        }


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    name: str
    id: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ToolCallArgs:
    index: int
    arguments: str


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class RawEvent:
    """Sent verbatim as one ``data:`` line (for malformed chunks)."""

    data: str


StreamEvent = Text | Reasoning | ToolCallStart | ToolCallArgs | Pause | RawEvent


@dataclass(frozen=True)
class Stream:
    events: Sequence[StreamEvent]
    usage: tuple[int, int] | None = (10, 5)
    finish_reason: str | None = None
    model: str = "test-model"
    #: False: stop after the events without a finish chunk or [DONE] (a broken stream).
    complete: bool = True


@dataclass(frozen=True)
class Error:
    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Delay:
    seconds: float
    then: Reply


@dataclass(frozen=True)
class Hangup:
    """Close the connection without sending a response."""


Reply = Completion | Stream | Error | Delay | Hangup | Callable[[RecordedRequest], Any]


def split_tool_call(index: int, name: str, arguments: str, pieces: int = 3) -> list[StreamEvent]:
    """A tool call whose arguments arrive in ``pieces`` chunks after the one naming it."""
    size = max(1, -(-len(arguments) // pieces))
    parts = [arguments[i : i + size] for i in range(0, len(arguments), size)]
    return [ToolCallStart(index, name), *(ToolCallArgs(index, part) for part in parts)]


def streamed(completion: Completion, *, pieces: int = 3) -> Stream:
    """``completion`` as a stream: its reasoning, its text in ``pieces`` chunks (before tool
    calls it is a preamble), then each tool call with its arguments split in ``pieces``."""
    events: list[StreamEvent] = []
    if completion.reasoning:
        events.append(Reasoning(completion.reasoning))
    text = completion.content or ""
    size = max(1, -(-len(text) // pieces))
    events.extend(Text(text[i : i + size]) for i in range(0, len(text), size))
    for index, call in enumerate(completion.tool_calls):
        wire = _wire_call(index, call)
        function = wire.get("function") or {}
        arguments = str(function.get("arguments") or "")
        events.append(ToolCallStart(index, str(function.get("name") or ""), id=wire.get("id")))
        events.extend(split_tool_call(index, "", arguments, pieces)[1:])
    return Stream(
        events,
        usage=completion.usage,
        finish_reason=completion.finish_reason,
        model=completion.model,
    )


def as_requested(
    reply: Callable[[RecordedRequest], Completion], *, pieces: int = 3
) -> Callable[[RecordedRequest], Completion | Stream]:
    """``reply``, answered as a stream (:func:`streamed`) when the request asked for one
    (``"stream": true``), so one script serves streaming and non-streaming clients alike."""

    def answer(request: RecordedRequest) -> Completion | Stream:
        completion = reply(request)
        wants_stream = isinstance(request.body, dict) and request.body.get("stream") is True
        return streamed(completion, pieces=pieces) if wants_stream else completion

    return answer


def context_overflow_error() -> Error:
    return Error(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 9000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
    )


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}


def _wire_call(index: int, call: tuple[str, str] | dict[str, Any]) -> dict[str, Any]:
    if isinstance(call, dict):
        return call
    name, arguments = call
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _chunk(model: str, delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def _event_delta(event: StreamEvent) -> dict[str, Any]:
    if isinstance(event, Text):
        return {"content": event.text}
    if isinstance(event, Reasoning):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        call = {
            "index": event.index,
            "id": event.id or f"call_{event.index}",
            "type": "function",
            "function": {"name": event.name, "arguments": event.arguments},
        }
        return {"tool_calls": [call]}
    assert isinstance(event, ToolCallArgs)
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.arguments}}]}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
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
            self._send(reply, request)

    def _send(self, reply: Reply, request: RecordedRequest) -> None:
        if isinstance(reply, Delay):
            if self.server.owner.stopping.wait(reply.seconds):
                return
            self._send(reply.then, request)
        elif isinstance(reply, Completion):
            self._json(200, reply.body(), {})
        elif isinstance(reply, Error):
            self._json(reply.status, reply.body, reply.headers)
        elif isinstance(reply, Stream):
            self._stream(reply)
        elif isinstance(reply, Hangup):
            self.close_connection = True
        else:
            self._send(reply(request), request)

    def _json(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        is_text = isinstance(body, str)
        data = (body if is_text else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if is_text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, stream: Stream) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        has_tools = False
        for event in stream.events:
            if isinstance(event, Pause):
                if self.server.owner.stopping.wait(event.seconds):
                    return
                continue
            has_tools = has_tools or isinstance(event, ToolCallStart)
            data = event.data if isinstance(event, RawEvent) else None
            self._event(data or json.dumps(_chunk(stream.model, _event_delta(event))))
        if not stream.complete:
            return
        finish = stream.finish_reason or ("tool_calls" if has_tools else "stop")
        self._event(json.dumps(_chunk(stream.model, {}, finish)))
        if stream.usage is not None:
            usage_chunk = {
                **_chunk(stream.model, None),
                "choices": [],
                "usage": _usage(stream.usage),
            }
            self._event(json.dumps(usage_chunk))
        self._event("[DONE]")

    def _event(self, data: str) -> None:
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 makes concurrent clients wait for a SYN retry (1 s).
    request_queue_size = 128
    owner: ModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.owner.errors.append(traceback.format_exc())


class ModelServer:
    """The loopback model server (see the module docstring). Start with ``with`` or start()."""

    def __init__(self) -> None:
        self._replies: deque[Reply] = deque()
        self._always: Reply | None = None
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.unexpected: list[RecordedRequest] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        # A short poll interval keeps shutdown (one per test) from costing half a second.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL an endpoint is configured with (``…/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def bodies(self) -> list[Any]:
        return [request.body for request in self.requests]

    def queue(self, *replies: Reply) -> ModelServer:
        with self._lock:
            self._replies.extend(replies)
        return self

    def always(self, reply: Reply | None) -> ModelServer:
        """Answer with ``reply`` whenever the queue is empty (None: stop doing so)."""
        with self._lock:
            self._always = reply
        return self

    def take(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            if request.path != CHAT_PATH:
                return Error(404, {"error": {"message": f"no route {request.path}"}})
            if self._replies:
                return self._replies.popleft()
            if self._always is not None:
                return self._always
            self.unexpected.append(request)
        return Error(500, {"error": {"message": "model_server: no scripted reply left"}})

    def start(self) -> ModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check(self) -> None:
        """Fail when a request found nothing scripted or the server itself crashed."""
        assert not self.unexpected, f"unscripted requests: {[r.body for r in self.unexpected]}"
        assert not self.errors, "model server errors:\n" + "\n".join(self.errors)


@pytest.fixture
def make_model_server() -> Iterator[Callable[[], ModelServer]]:
    """Start as many loopback model servers as a test needs (failover tests want two)."""
    servers: list[ModelServer] = []

    def make() -> ModelServer:
        server = ModelServer().start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
    for server in servers:
        server.check()


@pytest.fixture
def model_server(make_model_server: Callable[[], ModelServer]) -> ModelServer:
    return make_model_server()
