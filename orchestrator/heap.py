"""Garbage collection that does not walk what a long-running process loaded at start.

CPython's full collection walks every container object the process holds; a worker or web
process holds over a hundred thousand once Django, Celery, the models and the runtime are
imported, nearly all alive for the process's whole life. :func:`freeze_startup_heap` collects
once, then moves everything left to the permanent generation (``gc.freeze()``), which later
collections skip. Frozen objects are never collected, so it is called once, when the process is
ready. It also raises the youngest generation's threshold (:data:`YOUNG_THRESHOLD`), so the
objects a busy process makes and drops (500 live streams woken by one event) trigger a fraction
of the collections, and of the full ones they lead to (figures: ``docs/performance.md``).
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)
#: Allocations (net of frees) between young collections; CPython's default is 700.
YOUNG_THRESHOLD = 10_000


def freeze_startup_heap() -> int:
    """Collect, then keep everything alive now out of later collections; returns how many
    objects are frozen (in all)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    frozen = gc.get_freeze_count()
    logger.info("kept %d startup objects out of garbage collection", frozen)
    return frozen
