"""Database work for code that may run inside an event loop (where Django's ORM may not run):
a small thread pool whose threads close their connection after each piece of work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import connection

T = TypeVar("T")


class OffLoopDb:
    """``max_workers`` threads named ``name``; each call leaves no connection behind."""

    def __init__(self, name: str, max_workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)

    @staticmethod
    def _closing(fn: Callable[[], T]) -> Callable[[], T]:
        def call() -> T:
            try:
                return fn()
            finally:
                connection.close()

        return call

    def blocking(self, fn: Callable[[], T], timeout: float = 30) -> T:
        """``fn()`` here, or, inside an event loop, on a pool thread, waiting for it."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return fn()
        return self._pool.submit(self._closing(fn)).result(timeout=timeout)

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a pool thread, awaited."""
        return await asyncio.wrap_future(self._pool.submit(self._closing(fn)))

    def submit(self, fn: Callable[[], object]) -> None:
        """``fn()`` on a pool thread, not awaited (its errors are logged by the caller)."""
        self._pool.submit(self._closing(fn))
