"""Race helpers: run work in threads released together, one database connection per thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def in_threads(count: int, work: Callable[[int], Any], *, join_timeout: float = 150) -> list[Any]:
    """Run ``work(i)`` in ``count`` threads released together; exceptions are returned."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = work(index)
        except Exception as exc:  # the assertions look at every outcome
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_timeout)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return results
