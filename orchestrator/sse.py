"""Server-sent events (``text/event-stream``) from a feed read when something changed.

A *feed* is read (``poll``) when the stream starts and then whenever it may have changed; each
message goes out as ``id:``/``event:``/``data:`` lines whose data is JSON on one line. A stream
given a :class:`Wake` sleeps on the process's wake-up hub (:mod:`orchestrator.wakeups`,
PostgreSQL ``LISTEN/NOTIFY``) until a writer announces a change of its topics, or for
``SSE_SAFETY_POLL_SECONDS`` at most (a safety net for a write that announced nothing); without
a hub (SQLite), while the hub reconnects, inside an atomic block (a test's transaction, whose
writes are announced only at a commit that never comes) and for streams without a
:class:`Wake`, it reads every ``SSE_POLL_SECONDS``. A comment line is sent as a heartbeat when
nothing else was sent for ``SSE_HEARTBEAT_SECONDS`` (without reading anything); the stream
ends after ``SSE_MAX_SECONDS`` with the feed's farewell, or as soon as the feed is finished, or
when a read fails (the client's EventSource then reconnects with ``Last-Event-ID``). The timings
come from ``settings.LOOPWRIGHT_UI`` over :data:`DEFAULTS`.

Under ASGI the stream is an async generator that reads through ``sync_to_async`` (in its
request's thread); under WSGI it is a plain generator in the request's thread. Either way the
thread gives back its database connection after every read (and the one its request's
authentication opened), so an idle stream holds none: 500 open streams are not 500 database
connections.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse
from rest_framework.renderers import BaseRenderer

from orchestrator import wakeups
from orchestrator.request_threads import SHARED_REQUEST_THREAD

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, float] = {
    "SSE_POLL_SECONDS": 1.0,
    "SSE_SAFETY_POLL_SECONDS": 30.0,
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
    safety: float = 30.0


def stream_timing() -> Timing:
    """From ``settings.LOOPWRIGHT_UI`` (optional) over :data:`DEFAULTS`."""
    conf = {**DEFAULTS, **getattr(settings, "LOOPWRIGHT_UI", {})}
    return Timing(
        poll=float(conf["SSE_POLL_SECONDS"]),
        heartbeat=float(conf["SSE_HEARTBEAT_SECONDS"]),
        lifetime=float(conf["SSE_MAX_SECONDS"]),
        retry_ms=int(conf["SSE_RETRY_MS"]),
        safety=float(conf["SSE_SAFETY_POLL_SECONDS"]),
    )


@dataclass(frozen=True)
class Wake:
    """What wakes a stream: the hub's ``topics`` (``wakeups.run_topic``, ``wakeups.ANY_RUN``),
    and the least time between two of its reads (``gap``), so a burst of writes is read once."""

    topics: frozenset[str]
    gap: float = 0.0


@dataclass(frozen=True)
class Message:
    """One server-sent event; ``data`` is JSON on a single line."""

    event: str
    data: dict[str, Any]
    id: str | None = None

    def encode(self) -> bytes:
        """The message's bytes, encoded once (a message shared by many streams, e.g. a run's
        tail, is not encoded again for each)."""
        return self.encoded

    @functools.cached_property
    def encoded(self) -> bytes:
        lines = [] if self.id is None else [f"id: {self.id}"]
        lines.append(f"event: {self.event}")
        lines.append("data: " + json.dumps(self.data, cls=DjangoJSONEncoder, separators=(",", ":")))
        return ("\n".join(lines) + "\n\n").encode()


class Feed(Protocol):
    """What a stream reads: ``finished`` ends the stream after the batch that set it. Optional:
    ``close()``, called when the stream ends; ``between()``, called every ``SSE_POLL_SECONDS``
    while the stream sleeps on the hub, for what changes without a database write (the live
    text of a model step); ``poll_async()``, used instead of ``poll`` under ASGI by a feed that
    can answer from memory (it hops to a thread itself when it must read)."""

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
KEEPALIVE = b": keepalive\n\n"


class _Pacer:
    """When to read, when to send a heartbeat, and when the stream has lived long enough."""

    def __init__(self, timing: Timing, wake: Wake | None) -> None:
        self.timing = timing
        self.gap = wake.gap if wake is not None else 0.0
        self.started = self.last_sent = self.last_read = time.monotonic()

    def chunks(self, batch: list[Message]) -> list[bytes]:
        """The batch as one chunk: one write to the client per read, however many messages."""
        if not batch:
            return []
        self.last_sent = time.monotonic()
        return [b"".join(message.encode() for message in batch)]

    def keepalive(self) -> list[bytes]:
        """A heartbeat when one is due."""
        now = time.monotonic()
        if now - self.last_sent < self.timing.heartbeat:
            return []
        self.last_sent = now
        return [KEEPALIVE]

    def next_wait(self, deadline: float) -> float:
        """How long to sleep before the next heartbeat, the stream's end or ``deadline``."""
        ends = self.started + self.timing.lifetime
        beat = self.last_sent + self.timing.heartbeat
        return max(0.0, min(deadline, ends, beat) - time.monotonic())

    def gap_left(self) -> float:
        return max(0.0, self.last_read + self.gap - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() - self.started >= self.timing.lifetime


def _poll(feed: Feed, waiting: bool = False) -> tuple[list[Message] | None, bool]:
    """One read, and whether a stream ``waiting`` on the hub may sleep on it (it listens, and no
    atomic block holds this thread's connection); None when the read failed (the stream then
    ends and the client reconnects)."""
    hub = wakeups.hub() if waiting else None
    sound = hub is not None and hub.listening and not connection.in_atomic_block
    try:
        return feed.poll(), sound
    except Exception:
        logger.exception("live stream poll failed")
        return None, sound


def _release_connection() -> None:
    """Give back this thread's connection (unless a transaction, e.g. a test's, holds it, or the
    thread is a shared request thread whose connection serves the requests after this one)."""
    if not connection.in_atomic_block and not SHARED_REQUEST_THREAD.get():
        connection.close()


def _poll_releasing(feed: Feed, waiting: bool) -> tuple[list[Message] | None, bool]:
    try:
        return _poll(feed, waiting)
    finally:
        _release_connection()


def _subscribe(wake: Wake | None, waiter_class: type[wakeups.Waiter]) -> Any:
    """A waiter on the hub for the stream's topics (subscribed before its first read, so a
    change between a read and the sleep after it still wakes it); None without a hub."""
    hub = wakeups.hub() if wake is not None else None
    if hub is None or wake is None:
        return None
    waiter = waiter_class(wake.topics)
    hub.subscribe(waiter)
    return waiter


def _unsubscribe(waiter: wakeups.Waiter | None) -> None:
    hub = wakeups.hub() if waiter is not None else None
    if hub is not None and waiter is not None:
        hub.unsubscribe(waiter)


async def _poll_on_loop(feed: Feed, waiting: bool) -> tuple[list[Message] | None, bool]:
    """A read under ASGI: the feed's own ``poll_async()`` when it has one (it reads in a thread
    only what memory cannot answer), else :func:`_poll_releasing` in the request's thread."""
    poll_async = getattr(feed, "poll_async", None)
    if poll_async is None:
        return await sync_to_async(_poll_releasing)(feed, waiting)
    hub = wakeups.hub() if waiting else None
    try:
        batch: list[Message] = await poll_async()
    except Exception:
        logger.exception("live stream poll failed")
        return None, False
    return batch, hub is not None and hub.listening


def _close(feed: Feed) -> None:
    """A feed may hold something for its stream's life (``close()``, optional)."""
    close = getattr(feed, "close", None)
    if close is not None:
        close()


def _between(feed: Feed) -> list[Message]:
    """The feed's messages between reads (``between()``, optional: what it sends from outside
    the database while it sleeps on the hub); none when it failed."""
    between = getattr(feed, "between", None)
    if between is None:
        return []
    try:
        found: list[Message] = between()
    except Exception:
        logger.exception("live stream update between reads failed")
        return []
    finally:
        _release_connection()
    return found


def _ticks(pacer: _Pacer, feed: Feed, hub_sound: bool) -> tuple[float, float | None]:
    """The sleep's deadline (the safety poll on a sound hub, else the short poll) and, for a
    feed with ``between()`` on a sound hub, how often to call it."""
    now = time.monotonic()
    if not hub_sound:
        return now + pacer.timing.poll, None
    tick = pacer.timing.poll if hasattr(feed, "between") else None
    return now + pacer.timing.safety, tick


def _sleep_sync(
    pacer: _Pacer, feed: Feed, waiter: wakeups.ThreadWaiter | None, hub_sound: bool
) -> Iterator[bytes]:
    """Until the next read: a wake-up or the safety poll when the hub is sound, else the short
    poll (a waiter still wakes early, e.g. when the hub starts listening); sends the feed's
    messages between reads and the heartbeats that fall due meanwhile."""
    if waiter is None:
        time.sleep(pacer.timing.poll)
        yield from pacer.keepalive()
        return
    deadline, tick = _ticks(pacer, feed, hub_sound)
    while not pacer.expired and time.monotonic() < deadline:
        until = deadline if tick is None else min(deadline, time.monotonic() + tick)
        if waiter.wait(pacer.next_wait(until)):
            time.sleep(pacer.gap_left())
            return
        if tick is not None:
            yield from pacer.chunks(_between(feed))
            if feed.finished:
                return
        yield from pacer.keepalive()


async def _sleep_async(
    pacer: _Pacer, feed: Feed, waiter: wakeups.AsyncWaiter | None, hub_sound: bool
) -> AsyncIterator[bytes]:
    """:func:`_sleep_sync` on an event loop."""
    if waiter is None:
        await asyncio.sleep(pacer.timing.poll)
        for chunk in pacer.keepalive():
            yield chunk
        return
    deadline, tick = _ticks(pacer, feed, hub_sound)
    while not pacer.expired and time.monotonic() < deadline:
        until = deadline if tick is None else min(deadline, time.monotonic() + tick)
        if await waiter.wait(pacer.next_wait(until)):
            if pacer.gap:
                await asyncio.sleep(pacer.gap_left())
            return
        if tick is not None:
            for chunk in pacer.chunks(await sync_to_async(_between)(feed)):
                yield chunk
            if feed.finished:
                return
        for chunk in pacer.keepalive():
            yield chunk


def sync_events(feed: Feed, timing: Timing, wake: Wake | None = None) -> Iterator[bytes]:
    """The WSGI stream. A closed connection shows when a write fails (at the latest at the next
    heartbeat); the server then closes this generator."""
    pacer = _Pacer(timing, wake)
    OPEN_STREAMS.add(1)
    waiter = _subscribe(wake, wakeups.ThreadWaiter)
    try:
        yield f"retry: {timing.retry_ms}\n\n".encode()
        while not pacer.expired:
            pacer.last_read = time.monotonic()
            batch, hub_sound = _poll_releasing(feed, waiter is not None)
            if batch is None:
                return
            yield from pacer.chunks(batch)
            if feed.finished:
                return
            yield from _sleep_sync(pacer, feed, waiter, hub_sound)
            if feed.finished:
                return
        yield feed.farewell().encode()
    finally:
        _unsubscribe(waiter)
        _close(feed)
        OPEN_STREAMS.add(-1)


async def async_events(
    feed: Feed, timing: Timing, wake: Wake | None = None
) -> AsyncIterator[bytes]:
    """The ASGI stream; Django cancels it when the client disconnects."""
    pacer = _Pacer(timing, wake)
    OPEN_STREAMS.add(1)
    waiter = _subscribe(wake, wakeups.AsyncWaiter)
    try:
        yield f"retry: {timing.retry_ms}\n\n".encode()
        while not pacer.expired:
            pacer.last_read = time.monotonic()
            batch, hub_sound = await _poll_on_loop(feed, waiter is not None)
            if batch is None:
                return
            for chunk in pacer.chunks(batch):
                yield chunk
            if feed.finished:
                return
            async for chunk in _sleep_async(pacer, feed, waiter, hub_sound):
                yield chunk
            if feed.finished:
                return
        yield feed.farewell().encode()
    finally:
        _unsubscribe(waiter)
        _close(feed)
        OPEN_STREAMS.add(-1)
        await sync_to_async(_release_connection)()


def event_stream(
    request: HttpRequest, feed: Feed, wake: Wake | None = None
) -> StreamingHttpResponse:
    """The streaming response: async under ASGI, a plain generator under WSGI; ``wake``: what
    wakes it between reads (None: the short poll)."""
    timing = stream_timing()
    if isinstance(request, ASGIRequest):
        response = StreamingHttpResponse(async_events(feed, timing, wake))
    else:
        response = StreamingHttpResponse(sync_events(feed, timing, wake))
    response["Content-Type"] = "text/event-stream; charset=utf-8"
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # tell nginx-style proxies not to buffer
    return response


def last_event_id(request: HttpRequest, fallback_param: str) -> str:
    """The client's ``Last-Event-ID`` header, else the ``fallback_param`` query parameter."""
    return request.headers.get("Last-Event-ID") or request.GET.get(fallback_param, "")


class EventStreamRenderer(BaseRenderer):
    """Lets DRF's content negotiation accept ``Accept: text/event-stream`` (what EventSource
    sends); a stream itself is a StreamingHttpResponse, only refusals pass through here, as
    an ``error`` event."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        return Message("error", data if isinstance(data, dict) else {"detail": data}).encode()
