"""Database work for code that may run inside an event loop (where Django's ORM may not run):
small thread pools whose threads keep their connection through a burst of calls.

A connect per call cost a worker about a third of its throughput (docs/performance.md): a
thread's connection is reused while calls keep coming, closed after an idle second (the next
call connects again, failing fast when the database is out of reach).
:func:`connections_refresh` is the web process's long-lived threads' refresh (``dbpool``).
:func:`off_loop_threads_close` closes every pool's connections (a test session's end, before
its database is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from django.db import connections

T = TypeVar("T")

#: A connection idle for longer than this gets Django's per-request refresh (and health check,
#: ``CONN_HEALTH_CHECKS``) before its next use; a burst of calls reuses it without one round
#: trip each. A failed call still marks it, and the next call checks and replaces it.
REFRESH_IDLE_SECONDS = 1.0
_last_use = threading.local()


def connections_refresh() -> None:
    """Before a long-lived thread's next piece of work: what Django does at a request's start
    and end for its connections, without a round trip for a connection in steady use.
    ``CONN_MAX_AGE`` 0 (the SQLite default, meant for per-request threads) keeps them."""
    now = time.monotonic()
    idle = now - getattr(_last_use, "at", 0.0) > REFRESH_IDLE_SECONDS
    _last_use.at = now
    for connection in connections.all(initialized_only=True):
        if connection.settings_dict["CONN_MAX_AGE"] == 0:
            connection.close_at = None
        aged = connection.close_at is not None and now >= connection.close_at
        if idle or aged or connection.errors_occurred:
            connection.close_if_unusable_or_obsolete()


def connections_warm() -> None:
    """A long-lived thread's connections (an off-loop pool's, the wake-up announcer's), kept
    only while its calls come in a burst: after an idle second they are closed and the next
    call connects again (``connect_timeout``), so a connection that went bad while nothing
    used it (a network cut, a server restart) is never waited on; a failed or aged one is
    refreshed as Django would. Through a burst, no health check (``SELECT 1``) per call."""
    now = time.monotonic()
    idle = now - getattr(_last_use, "at", 0.0) > REFRESH_IDLE_SECONDS
    _last_use.at = now
    if idle:
        connections.close_all()
        return
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred or (
            connection.close_at is not None and now >= connection.close_at
        ):
            connection.close_if_unusable_or_obsolete()


class OffLoopDb:
    """``max_workers`` threads named ``name`` that keep their connection through a burst of
    calls (:func:`connections_warm`)."""

    def __init__(self, name: str, max_workers: int = 2) -> None:
        self._max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        _POOLS.append(self)

    @staticmethod
    def _refreshed(fn: Callable[[], T]) -> Callable[[], T]:
        def call() -> T:
            connections_warm()
            return fn()

        return call

    def blocking(self, fn: Callable[[], T], timeout: float = 30) -> T:
        """``fn()`` here, or, inside an event loop, on a pool thread, waiting for it."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return fn()
        return self._pool.submit(self._refreshed(fn)).result(timeout=timeout)

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a pool thread, awaited."""
        return await asyncio.wrap_future(self._pool.submit(self._refreshed(fn)))

    def submit(self, fn: Callable[[], object]) -> None:
        """``fn()`` on a pool thread, not awaited (its errors are logged by the caller)."""
        self._pool.submit(self._refreshed(fn))

    def close_connections(self) -> None:
        """Close the connection of every thread of this pool (each closes its own)."""
        barrier = threading.Barrier(self._max_workers)

        def close() -> None:
            # Each task holds its thread until all are running, so every thread closes its own.
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)
            connections.close_all()

        wait([self._pool.submit(close) for _ in range(self._max_workers)], timeout=10)


_POOLS: list[OffLoopDb] = []


def off_loop_threads_close() -> None:
    """Close the connections every :class:`OffLoopDb` pool's threads keep."""
    for pool in _POOLS:
        pool.close_connections()
