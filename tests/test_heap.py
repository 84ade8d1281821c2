"""Startup objects kept out of garbage collection (``orchestrator.heap``): the worker freezes
its heap once it is ready, the web app once its lifespan has started."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from types import SimpleNamespace

import pytest


@pytest.fixture
def thawed() -> Iterator[None]:
    """Each test starts with nothing frozen and gives back what it froze (and the thresholds)."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class _Marker:
    """A container object of our own, to find in (or miss from) the collector's lists."""

    def __init__(self) -> None:
        self.parts: list[object] = []


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_frozen_objects_are_left_out_of_later_collections(thawed: None) -> None:
    from orchestrator.heap import YOUNG_THRESHOLD, freeze_startup_heap

    loaded = _Marker()
    assert _tracked(loaded)
    # (Not compared with gc.get_freeze_count() afterwards: a frozen object another thread
    # frees meanwhile leaves the permanent generation.)
    assert freeze_startup_heap() > 0
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD  # young collections 14x rarer than CPython's
    assert not _tracked(loaded), "a frozen object is still in a generation collections walk"
    later = _Marker()
    assert _tracked(later), "what the process allocates after the freeze is collected as usual"


def test_a_worker_freezes_its_heap_when_ready(thawed: None) -> None:
    from loops import tasks
    from loops.worker import driver as driver_module

    # A skills worker (it drives no runs): worker_ready starts no driver, and still freezes.
    skills_only = SimpleNamespace(
        app=SimpleNamespace(
            amqp=SimpleNamespace(queues=SimpleNamespace(consume_from={"skills": 1}))
        )
    )
    before = driver_module._driver
    tasks._start_driver(sender=skills_only)
    assert gc.get_freeze_count() > 0
    assert driver_module._driver is before


def test_the_web_app_freezes_its_heap_once_started(thawed: None) -> None:
    from orchestrator import asgi

    async def started() -> int:
        async with asgi.lifespan(asgi.application):
            return gc.get_freeze_count()

    assert asyncio.run(started()) > 0
