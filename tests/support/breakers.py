"""Fixtures of the endpoint circuit-breaker tests: both shared stores and a fake clock.

``store`` is parametrized over the database store and, when ``REDIS_URL`` is set, the Redis
store (real Redis, a private key prefix removed afterwards). ``clock`` is handed to the breaker,
so cooldowns of minutes take no wall time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from orchestrator.agents.breaker_store import DatabaseBreakerStore
from runtime.breaker import BreakerStore, RedisBreakerStore


class FakeClock:
    def __init__(self) -> None:
        self.value = 1_800_000_000.0

    def now(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[BreakerStore]:
    if request.param == "database":
        yield DatabaseBreakerStore()
        # The async path runs the ORM on asgiref's sync thread: close its connection too.
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())
        return
    if not settings.REDIS_URL:
        pytest.skip("REDIS_URL is not set: the Redis breaker store is tested against real Redis")
    client = redis.Redis.from_url(settings.REDIS_URL)
    prefix = f"loopwright-test:{uuid.uuid4().hex}:"
    yield RedisBreakerStore(client, prefix=prefix)
    for name in client.scan_iter(match=prefix + "*"):
        client.delete(name)
    client.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
