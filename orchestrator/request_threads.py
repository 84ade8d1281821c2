"""Django's ASGI handler with its requests' sync work on a few long-lived threads.

Django's own handler enters a new ``ThreadSensitiveContext`` per request: each request's
middleware, view and signals run on a thread made for it, whose database connection is opened
for it and never reused (a PostgreSQL connect, ~7 ms, on every request; connections pile up
until the threads are collected). Here each request is bound to one of :data:`REQUEST_THREADS`
single-thread executors that live as long as the process: its sync work still runs on one
thread, as Django requires, and that thread's connection is kept between requests (closed and
health-checked per request as ``CONN_MAX_AGE`` / ``CONN_HEALTH_CHECKS`` say).

Holds: a request is bound to the executor with the fewest requests in flight (the first on a
tie, so an idle service keeps reusing one warm connection); executors are shared, never
exhausted, so long-lived responses (event streams) do not hold others up. A web process holds
at most ``REQUEST_THREADS`` connections for requests (plus :mod:`orchestrator.dbpool`'s).

A plain (not streamed) response costs one thread hop: ``request_started``, the middleware chain
and the view, and the response's close (``request_finished``) run together on the request's
thread, then the event loop sends the body (Django hops three times: the signal, the chain, the
close). A streamed response (a live stream) is sent as Django sends it: the client's
disconnect stops it, and it is closed once sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpRequest, HttpResponseBase
from django.urls import set_script_prefix, set_urlconf
from django.utils.log import log_response

#: True while a request is served on a shared request thread: its connection is the thread's,
#: kept for the requests after it (a live stream does not close it between reads).
SHARED_REQUEST_THREAD: ContextVar[bool] = ContextVar("shared_request_thread", default=False)

#: Threads (and so database connections) for the requests of one web process.
REQUEST_THREADS = max(1, int(os.environ.get("LOOPWRIGHT_WEB_REQUEST_THREADS", "4")))


class RequestThreads:
    """Single-thread executors and how many requests each serves now (event loop only)."""

    def __init__(self, count: int) -> None:
        self.executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"web-request-{n}")
            for n in range(count)
        ]
        self.in_flight = [0] * count

    def acquire(self) -> int:
        index = min(range(len(self.in_flight)), key=self.in_flight.__getitem__)
        self.in_flight[index] += 1
        return index

    def release(self, index: int) -> None:
        self.in_flight[index] -= 1


class PooledThreadsASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose requests run their sync work on :class:`RequestThreads`."""

    def __init__(self, threads: int = REQUEST_THREADS) -> None:
        super().__init__()
        self.threads = RequestThreads(threads)

    def load_middleware(self, is_async: bool = False) -> None:
        """The middleware chain and the view in sync mode, entered once per request on its
        thread: Django's async mode awaits each async-capable middleware's hooks through its own
        ``sync_to_async`` (a dozen thread hops a request, ~5 ms through uvicorn)."""
        super().load_middleware(is_async=False)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP here, not {scope['type']}.")
        index = self.threads.acquire()
        SHARED_REQUEST_THREAD.set(True)
        try:
            async with ThreadSensitiveContext(executor=self.threads.executors[index]):
                await self.handle(scope, receive, send)
        finally:
            self.threads.release(index)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """Django's ``ASGIHandler.handle`` with the request's sync work in one thread hop
        (:meth:`_respond`); what it sends, and when it closes a streamed response, are Django's."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:  # not even a request (a bad header, a body over the limit)
            assert error_response is not None
            await signals.request_started.asend(sender=self.__class__, scope=scope)
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return
        try:
            response = await sync_to_async(self._respond, thread_sensitive=True)(request, scope)
            if response.streaming:
                await self._stream(response, receive, send)
            else:
                await self.send_response(response, send)  # closed already
        finally:
            body_file.close()

    def _respond(self, request: HttpRequest, scope: Any) -> HttpResponseBase:
        """On the request's thread: what Django's ``handle`` and ``get_response_async`` do
        before sending, and a plain response's close (its content is already rendered)."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        set_urlconf(settings.ROOT_URLCONF)
        handler: Any = self
        response: Any = handler._middleware_chain(request)
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            log_response(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        if not response.streaming:
            response.close()
        return response

    async def _stream(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        """Send a streamed response until it ends or the client goes (as Django does), then
        close it."""

        async def sending() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # the client went away meanwhile
                await self.send_response(response, send)

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(sending()),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                await task  # any other error of either task is raised, as Django does
        await sync_to_async(response.close)()
