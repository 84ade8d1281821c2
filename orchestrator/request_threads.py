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
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler

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
        chain: Any = self
        chain._middleware_chain = sync_to_async(chain._middleware_chain, thread_sensitive=True)

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
