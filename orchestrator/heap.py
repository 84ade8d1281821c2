"""Garbage collection that does not pause a long-running process for what it loaded at start.

CPython's full (oldest-generation) collection walks every container object the process holds.
A worker or web process holds well over a hundred thousand of them once Django, Celery, the
models and the runtime are imported, nearly all of them alive for the process's whole life;
walking them took 50 ms on an idle 2-core machine and 120-250 ms under load, a pause that lands
on whatever run or request is in flight when it comes (the resume benchmark's p99 was such a
pause). :func:`freeze_startup_heap` collects once, then moves everything left to the
interpreter's permanent generation (``gc.freeze()``), which later collections skip: they walk
only what the process allocated since. Objects frozen are never collected, which is right for
modules, classes and settings, and why it is called once, when the process is ready.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)


def freeze_startup_heap() -> int:
    """Collect, then keep everything alive now out of later collections; returns how many
    objects are frozen (in all)."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("kept %d startup objects out of garbage collection", frozen)
    return frozen
