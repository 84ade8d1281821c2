"""Server-sent events (``text/event-stream``) from a polled feed.

A *feed* is polled every ``SSE_POLL_SECONDS``; each message goes out as
``id:``/``event:``/``data:`` lines whose data is JSON on one line. A comment line is sent as a
heartbeat when nothing else was sent for ``SSE_HEARTBEAT_SECONDS``; the stream ends after
``SSE_MAX_SECONDS`` with the feed's farewell, or as soon as the feed is finished, or when a poll
fails (the client's EventSource then reconnects with ``Last-Event-ID``). The timings come from
``settings.LOOPWRIGHT_UI`` over :data:`DEFAULTS`.

Under ASGI the stream is an async generator that polls through ``sync_to_async``; under WSGI it
is a plain generator in the request's thread, which gives back its database connection after
every poll, so an idle stream holds none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, float] = {
    "SSE_POLL_SECONDS": 1.0,
    "SSE_HEARTBEAT_SECONDS": 15.0,
    "SSE_MAX_SECONDS": 300.0,
    "SSE_RETRY_MS": 2000,
}


@dataclass(frozen=True)
class Timing:
    poll: float
    heartbeat: float
    lifetime: float
    retry_ms: int


def stream_timing() -> Timing:
    """From ``settings.LOOPWRIGHT_UI`` (optional) over :data:`DEFAULTS`."""
    conf = {**DEFAULTS, **getattr(settings, "LOOPWRIGHT_UI", {})}
    return Timing(
        poll=float(conf["SSE_POLL_SECONDS"]),
        heartbeat=float(conf["SSE_HEARTBEAT_SECONDS"]),
        lifetime=float(conf["SSE_MAX_SECONDS"]),
        retry_ms=int(conf["SSE_RETRY_MS"]),
    )


@dataclass(frozen=True)
class Message:
    """One server-sent event; ``data`` is JSON on a single line."""

    event: str
    data: dict[str, Any]
    id: str | None = None

    def encode(self) -> bytes:
        lines = [] if self.id is None else [f"id: {self.id}"]
        lines.append(f"event: {self.event}")
        lines.append("data: " + json.dumps(self.data, cls=DjangoJSONEncoder, separators=(",", ":")))
        return ("\n".join(lines) + "\n\n").encode()


class Feed(Protocol):
    """What a stream polls: ``finished`` ends the stream after the batch that set it."""

    finished: bool

    def poll(self) -> list[Message]: ...

    def farewell(self) -> Message: ...


class _OpenStreams:
    """How many streams are open in this process (for operations, and for tests to wait on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self, delta: int) -> None:
        with self._lock:
            self._count += delta

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


OPEN_STREAMS = _OpenStreams()


class _Pacer:
    """Decides when to send a heartbeat and when the stream has lived long enough."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.started = self.last_sent = time.monotonic()

    def chunks(self, batch: list[Message]) -> list[bytes]:
        now = time.monotonic()
        out = [message.encode() for message in batch]
        if not out and now - self.last_sent >= self.timing.heartbeat:
            out.append(b": keepalive\n\n")
        if out:
            self.last_sent = now
        return out

    @property
    def expired(self) -> bool:
        return time.monotonic() - self.started >= self.timing.lifetime


def _poll(feed: Feed) -> list[Message] | None:
    """One poll; None when it failed (the stream then ends and the client reconnects)."""
    try:
        return feed.poll()
    except Exception:
        logger.exception("live stream poll failed")
        return None


def _release_connection() -> None:
    """Give back this thread's connection (unless a transaction, e.g. a test's, holds it)."""
    if not connection.in_atomic_block:
        connection.close()


def _poll_releasing(feed: Feed) -> list[Message] | None:
    try:
        return _poll(feed)
    finally:
        _release_connection()


def sync_events(feed: Feed, timing: Timing) -> Iterator[bytes]:
    """The WSGI stream. A closed connection shows when a write fails (at the latest at the next
    heartbeat); the server then closes this generator."""
    pacer = _Pacer(timing)
    OPEN_STREAMS.add(1)
    try:
        yield f"retry: {timing.retry_ms}\n\n".encode()
        while not pacer.expired:
            batch = _poll_releasing(feed)
            if batch is None:
                return
            yield from pacer.chunks(batch)
            if feed.finished:
                return
            time.sleep(timing.poll)
        yield feed.farewell().encode()
    finally:
        OPEN_STREAMS.add(-1)


async def async_events(feed: Feed, timing: Timing) -> AsyncIterator[bytes]:
    """The ASGI stream; Django cancels it when the client disconnects."""
    pacer = _Pacer(timing)
    OPEN_STREAMS.add(1)
    try:
        yield f"retry: {timing.retry_ms}\n\n".encode()
        while not pacer.expired:
            batch = await sync_to_async(_poll)(feed)
            if batch is None:
                return
            for chunk in pacer.chunks(batch):
                yield chunk
            if feed.finished:
                return
            await asyncio.sleep(timing.poll)
        yield feed.farewell().encode()
    finally:
        OPEN_STREAMS.add(-1)
        await sync_to_async(_release_connection)()


def event_stream(request: HttpRequest, feed: Feed) -> StreamingHttpResponse:
    """The streaming response: async under ASGI, a plain generator under WSGI."""
    timing = stream_timing()
    if isinstance(request, ASGIRequest):
        response = StreamingHttpResponse(async_events(feed, timing))
    else:
        response = StreamingHttpResponse(sync_events(feed, timing))
    response["Content-Type"] = "text/event-stream; charset=utf-8"
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # tell nginx-style proxies not to buffer
    return response


def last_event_id(request: HttpRequest, fallback_param: str) -> str:
    """The client's ``Last-Event-ID`` header, else the ``fallback_param`` query parameter."""
    return request.headers.get("Last-Event-ID") or request.GET.get(fallback_param, "")
