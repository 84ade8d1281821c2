"""The web process's request-path database work (the OpenAI-compatible endpoint, the prompt
blocks of its chats) on a few long-lived threads that keep their connections.

Django's ASGI handler gives every request its own thread for ``sync_to_async`` work, and so its
own database connection: a connect per request, and as many connections as requests in flight
(100 concurrent streams exhaust PostgreSQL's default 100). Here every read and write of the
endpoint runs on :data:`DB_THREADS` threads instead; each keeps its connection between requests,
refreshed as Django does per request (``orchestrator.dbthreads.connections_refresh``: closed
when unusable after an error, or past a set ``CONN_MAX_AGE``; health checks as configured), so
a web process holds at most that many connections for the endpoint.

Outside Django's ASGI handler (the test client, a script) there is no per-request thread, and
the work runs where Django's own ``sync_to_async`` puts it (the caller's thread and connection,
so a test's transaction is seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

from asgiref.sync import SyncToAsync, sync_to_async
from django.db import connections

from orchestrator.bare_asgi import BARE_REQUEST
from orchestrator.dbthreads import connections_refresh

T = TypeVar("T")
DB_THREADS = 4
_EXECUTOR = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="web-db")


def _call(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    connections_refresh()
    return fn(*args)


def _per_request_threads() -> bool:
    """Whether Django's ASGI handler gave this request a thread of its own for sync work, or
    the request is served by the bare handler (which gives none)."""
    return BARE_REQUEST.get() or SyncToAsync.thread_sensitive_context.get(None) is not None


async def db_call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on one of the database threads (cancelling the await leaves it to finish)."""
    if not _per_request_threads():
        result: T = await sync_to_async(fn)(*args)
        return result
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_EXECUTOR, functools.partial(_call, fn, args))


def db_threads_close() -> None:
    """Close the connection of every database thread (a test's end, a process's shutdown)."""
    barrier = threading.Barrier(DB_THREADS)

    def close() -> None:
        # Each task holds its thread until all are running, so every thread closes its own.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=5)
        connections.close_all()

    wait([_EXECUTOR.submit(close) for _ in range(DB_THREADS)], timeout=10)
